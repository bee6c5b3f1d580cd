"""Stage maps: which pipeline stage each layer of a network runs on.

A stage map gives every layer (in layer order) a stage 0..M−1. Data only flows forward through a
pipeline, so a layer's stage is never below the stage of a layer feeding it (on a chain: non-decreasing),
and every stage holds at least one layer. Two spellings on the command line:

- `0,0,1,2,2` — one stage per layer, in layer order;
- `even:M`   — M stages of balanced forward cost, each a contiguous run of layers in layer (topological)
  order, chosen by `partition_contiguous` (the project's one min-max contiguous partitioner, which the
  pipeline policies use too) to minimise the largest stage's F cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from layerpipe.costs import CostModel, MacsModel, task_cost
from layerpipe.errors import InputError
from layerpipe.network import INPUT, Network

__all__ = ["check_stage_map", "even_stages", "parse_stage_map", "partition_contiguous", "stages_after"]

FIELD = "--stages"


def parse_stage_map(spec: str, network: Network, model: CostModel | None = None) -> tuple[int, ...]:
    """A stage per layer from `0,0,1,2` or `even:M` (balanced over `model`'s forward costs; default MACs)."""
    text = spec.strip()
    if text.startswith("even:"):
        count = text[len("even:"):]
        try:
            num_stages = int(count)
        except ValueError:
            raise InputError(f"{FIELD}: even:M needs an integer M, got '{count}'") from None
        return even_stages(network, num_stages, model)
    try:
        stages = [int(part) for part in text.split(",")]
    except ValueError:
        raise InputError(f"{FIELD} must be a comma list of stages like 0,0,1,2 or even:M, got '{spec}'") from None
    return check_stage_map(stages, network)


def check_stage_map(stages: Sequence[int], network: Network) -> tuple[int, ...]:
    """Validate a stage per layer: right length, stages ≥ 0, non-decreasing along every edge, none empty."""
    if len(stages) != len(network):
        raise InputError(f"{FIELD}: expected {len(network)} stages (one per layer of {network.name}), "
                         f"got {len(stages)}")
    negative = [s for s in stages if s < 0]
    if negative:
        raise InputError(f"{FIELD}: stages must be >= 0, got {negative[0]}")
    too_big = [s for s in stages if s >= len(network)]  # before range(max + 1) below allocates it
    if too_big:
        raise InputError(f"{FIELD}: stages must be in 0..{len(network) - 1} (one layer per stage at most), "
                         f"got {too_big[0]}")
    for layer in network.layers:
        for src in layer.inputs:
            if src != INPUT and stages[src - 1] > stages[layer.index - 1]:
                where = "along the chain" if network.is_chain else "along every edge"
                raise InputError(f"{FIELD}: stages must be non-decreasing {where}; layer '{layer.name}' is "
                                 f"on stage {stages[layer.index - 1]} but its input "
                                 f"'{network.layer(src).name}' is on stage {stages[src - 1]}")
    missing = sorted(set(range(max(stages) + 1)) - set(stages))
    if missing:
        raise InputError(f"{FIELD}: every stage 0..{max(stages)} must hold a layer; stage {missing[0]} is empty")
    return tuple(int(s) for s in stages)


def even_stages(network: Network, num_stages: int, model: CostModel | None = None) -> tuple[int, ...]:
    """M contiguous stages (layer order) minimising the largest stage's forward cost (`partition_contiguous`)."""
    layers = len(network)
    if not 1 <= num_stages <= layers:
        raise InputError(f"{FIELD}: even:M needs 1 <= M <= {layers} (the number of layers), got {num_stages}")
    model = model or MacsModel()
    cost = [task_cost(model, layer, "F", network.batch) for layer in network.layers]
    stages = [0] * layers
    for stage, run in enumerate(partition_contiguous(cost, num_stages)):
        for i in run:
            stages[i] = stage
    return tuple(stages)


def partition_contiguous(weights: Sequence[int], parts: int) -> list[list[int]]:
    """Split item indices 0..n−1 into `parts` non-empty contiguous runs minimising the heaviest run.

    The one stage partitioner of the project: `even:M` stage maps and the pipeline policies (PipeDream's
    stages, GPipe/1F1B's, the timeline partition) all cut with it. Bisection on the bottleneck B with a
    greedy check (fill each run while it stays ≤ B: the linear-partition problem's classic O(n log Σw)
    answer, as in PipeDream's planner's contiguous split), then runs are split until there are exactly
    `parts` (splitting never raises the maximum). Deterministic: early runs take as much as B allows.
    """
    n = len(weights)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} items into {parts} non-empty parts")

    def greedy(bound: int) -> list[list[int]]:
        runs: list[list[int]] = [[]]
        total = 0
        for i, w in enumerate(weights):
            if runs[-1] and total + w > bound:
                runs.append([])
                total = 0
            runs[-1].append(i)
            total += w
        return runs

    lo, hi = max(weights), sum(weights)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(greedy(mid)) <= parts:
            hi = mid
        else:
            lo = mid + 1
    runs = greedy(lo)
    while len(runs) < parts:  # split the longest run (by item count) until there are enough
        k = max(range(len(runs)), key=lambda r: (len(runs[r]), -r))
        half = len(runs[k]) // 2
        runs[k : k + 1] = [runs[k][:half], runs[k][half:]]
    return runs


def stages_after(stages: Sequence[int]) -> tuple[int, ...]:
    """S(l): how many pipeline stages follow layer l's stage."""
    last = max(stages)
    return tuple(last - s for s in stages)
