"""The `ooo` list simulation (`layerpipe.schedule._ooo_order`, issue 14's speed work) gives the order and estimate the
scan it replaced gave — by its Python heaps and by its C version (`lp_ooo_order`) alike: `scan_order` below is that
scan (every decision rescans each processor's candidates), kept as the reference. Also: `cutoff` stops a
simulation exactly when its makespan would exceed it, `makespan_bound` is a lower bound, and `schedule_ooo` plans
the same layouts to time as simulating every layout in full does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from layerpipe.costs import make_cost_model
from layerpipe.interconnect import Interconnect, parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule._deps import StageInfo
from layerpipe.schedule._ooo import MAX_TIMED_LAYOUTS, _plan_layouts, modulo_stages, stage_costs
from layerpipe.schedule._ooo_order import StageCost, makespan_bound, ooo_order
from layerpipe.schedule._stage_programs import StageOp
from layerpipe.schedule._sync_policies import contiguous_stages, training_graph

INTERCONNECTS = ("shared", "links:2:16", "bus:1:2", "links:0:1/4", "links:5:1")


def scan_order(costs: Sequence[StageCost], n: int, m: int, push: bool, stages: StageInfo,
               interconnect: Interconnect) -> tuple[list[list[StageOp]], int]:
    """The reference: at every decision each processor's best candidate by (start, priority, op) over all of
    them, the op placed the least of those by (start, priority, processor)."""
    count, last = len(costs), len(costs) - 1
    proc = [s % n for s in range(count)]
    end: dict[StageOp, int] = {}
    free = [0] * n
    rows: list[list[StageOp]] = [[] for _ in range(n)]
    nxt = {kind: [0] * count for kind in "FIW"}

    def arrival(producer: StageOp, words: int, here: int) -> int | None:
        done = end.get(producer)
        if done is None:
            return None
        return done if proc[producer[1]] == here else done + interconnect.transfer_cycles(words)

    def ready_time(kind: str, s: int, t: int) -> int | None:
        here = proc[s]
        needs: list[int | None] = []
        if kind == "F":
            if s:
                needs.append(arrival(("F", s - 1, t), stages.words_into_forward(s), here))
            if push and s == 0 < last and t >= n:
                needs.append(end.get(("W", 0, t - n)))
        elif kind == "I":
            needs.append(end.get(("F", s, t)))
            if s < last:
                needs.append(arrival(("I", s + 1, t), stages.words_into_backward(s), here))
                if t:
                    needs.append(end.get(("W", s, t - 1)))
        else:
            needs.append(end.get(("I", s, t) if s < last else ("I", s, m - 1)))
        return None if None in needs else max([0, *(x for x in needs if x is not None)])

    for _ in range(3 * m * count):
        best_of: list[tuple[int, tuple[int, int, int], StageOp] | None] = [None] * n
        for s in range(count):
            p = proc[s]
            for kind in "FIW":
                t = nxt[kind][s]
                r = ready_time(kind, s, t) if t < m else None
                if r is None:
                    continue
                gates = kind == "W" and s < last and nxt["I"][s] == t + 1 and ("I", s + 1, t + 1) in end
                priority = ((0, t, -s) if kind == "I" or gates else (1, s, t) if kind == "F" else (2, t, s))
                key = (max(r, free[p]), priority, (kind, s, t))
                best = best_of[p]
                if best is None or key < best:
                    best_of[p] = key
        (start, _, op), here = min(((b, p) for p, b in enumerate(best_of) if b is not None),
                                   key=lambda pair: (pair[0][0], pair[0][1], pair[1]))
        kind, s, t = op
        c = costs[s]
        took = {"F": c.forward, "I": c.input_grad, "W": c.weight_grad}[kind] + (
            c.update if kind == "W" and t == m - 1 else 0)
        end[op] = free[here] = start + took
        rows[here].append(op)
        nxt[kind][s] += 1
    return rows, max(end.values())


def random_case(rng: random.Random) -> tuple[list[StageCost], int, int, bool, StageInfo, Interconnect]:
    count = rng.randint(1, 10)
    n, m = rng.randint(1, min(count, 5)), rng.randint(1, 10)
    hi = rng.choice([1, 3, 10, 100])
    costs = [StageCost(*(rng.randint(0, hi) for _ in range(4))) for _ in range(count)]
    if rng.random() < 0.3:  # uniform stages: many ties
        costs = [costs[0]] * count
    words = [tuple(rng.randint(0, 40) for _ in range(count)) for _ in range(2)]
    stages = StageInfo(count, *words) if rng.random() < 0.8 else StageInfo(count)
    return costs, n, m, rng.random() < 0.4, stages, parse_interconnect(rng.choice(INTERCONNECTS), lanes=4)


@pytest.fixture(params=["heaps", "c"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """`ooo_order` by its Python heaps, or by C (`lp_ooo_order`, where the library is built: else skipped)."""
    from layerpipe.schedule import _native

    if request.param == "heaps":
        monkeypatch.setattr(_native, "_loaded", [None])
    elif _native.library() is None:
        pytest.skip("the C kernels are not built here")
    return str(request.param)


@pytest.mark.parametrize("seed", range(4))
def test_heaps_give_the_scan_order(seed: int, engine: str) -> None:
    """Both the Python heaps and C's scan (`_kernels.c`) give the reference scan's order, estimate and cutoffs."""
    rng = random.Random(seed)
    for _ in range(150):
        case = random_case(rng)
        want = scan_order(*case)
        assert ooo_order(*case) == want, case
        costs, n, m = case[:3]
        assert makespan_bound(costs, n, m) <= want[1]
        cutoff = rng.randint(0, want[1] + 3)
        cut = ooo_order(*case, cutoff=cutoff)
        assert cut == (None if want[1] > cutoff else want), (case, cutoff)


@pytest.mark.parametrize(("spec", "procs", "ic"), [("lenet5", 2, "rtl"), ("alexnet", 3, "links:2:16"),
                                                   ("resnet18", 4, "rtl"), ("mlp:8-8-8-8-8-8-8-8-8-8", 5, "shared")])
@pytest.mark.parametrize("push", [False, True])
def test_planned_layouts_are_the_exhaustive_ones(spec: str, procs: int, ic: str, push: bool) -> None:
    """The layouts `_plan_layouts` simulates in full include the MAX_TIMED_LAYOUTS best by (estimate, k) and the
    contiguous one, with the estimates and orders that simulating every layout gives."""
    network, model = load_network(spec), make_cost_model("pe", lanes=4)
    interconnect = parse_interconnect(ic, lanes=4)
    graph = training_graph(network)
    m = 2 * min(procs, len(network))
    layouts = [(g, modulo_stages(network, g)) for g in range(1, -(-len(network) // procs) + 1)]
    layouts.append((None, contiguous_stages(network, graph, model, min(procs, len(network)), m)))
    every = []
    for k, (g, stage_layers) in enumerate(layouts):
        rows, estimate = ooo_order(stage_costs(graph, model, stage_layers), min(procs, len(stage_layers)), m, push,
                                   StageInfo.of_network(graph, stage_layers), interconnect)
        every.append((estimate, k, g, stage_layers, rows))
    every.sort(key=lambda plan: plan[:2])
    wanted = every[:MAX_TIMED_LAYOUTS] + [plan for plan in every[MAX_TIMED_LAYOUTS:] if plan[2] is None]
    planned = sorted(_plan_layouts(graph, model, layouts, procs, m, push, interconnect), key=lambda plan: plan[:2])
    assert planned[:MAX_TIMED_LAYOUTS] + [plan for plan in planned[MAX_TIMED_LAYOUTS:] if plan[2] is None] == wanted
