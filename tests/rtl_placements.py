"""Generated placements for the accelerator's tests: any map of F/A/E/G/U tasks to PEs, scheduled by the
project's own passes (the `layerpipe` policy's timing of one placement on the `rtl` interconnect).

The hardware must run every placement a communication-aware policy can emit, not only the ones the policy
picks today, so the tests draw the placement at random (hypothesis) and let `layerpipe.schedule` time it:
`placed_design(widths, where, N, lanes, T)` is what `make_design` builds, with the placement given.
"""

from __future__ import annotations

from hypothesis import strategies as st

from layerpipe._rtl_costs import RTLCostModel
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.hdl._compiler import compile_program
from layerpipe.hdl._flow import DEFAULT_LR_SHIFT, Design
from layerpipe.interconnect import Interconnect
from layerpipe.network import mlp
from layerpipe.schedule._lags import asap_times
from layerpipe.schedule._layerpipe import LayerPipeOptions, _time
from layerpipe.schedule._result import ScheduleResult, periodic_result
from layerpipe.schedule._task_table import TaskTable

__all__ = ["placed_design", "placed_schedule", "placements"]


def placed_schedule(widths: list[int], where: dict[str, int], num_pes: int, lanes: int,
                    mode: str = "stash", batch: int = 1) -> ScheduleResult:
    """The periodic schedule of `mlp(widths)` (micro-batches of `batch`) with task `where[name]` on that PE
    (names like "F1", "U2")."""
    net = mlp(widths, batch=batch)
    table = TaskTable.of(build_training_graph(net, GraphOptions(weight_mode=mode)), RTLCostModel(lanes))
    placement = [where[str(t)] for t in table.tasks]
    interconnect = Interconnect.rtl(lanes)
    timed = _time(table, num_pes, placement, asap_times(table), interconnect)
    return periodic_result("layerpipe", LayerPipeOptions(keep_weights_together=False), table, num_pes,
                           timed.placement, timed.timing.start, timed.timing.lag, timed.period, table.cost,
                           interconnect=interconnect, arrival=timed.timing.arrival)


def placed_design(widths: list[int], where: dict[str, int], num_pes: int, lanes: int, samples: int,
                  mode: str = "stash", batch: int = 1) -> Design:
    result = placed_schedule(widths, where, num_pes, lanes, mode, batch)
    assert result.periodic is not None and result.graph is not None
    net = result.graph.network
    program = compile_program(net, result.graph, result.periodic, lanes, samples, policy="layerpipe")
    return Design(net, "layerpipe", num_pes, lanes, samples, DEFAULT_LR_SHIFT, result, program)


def task_names(num_layers: int) -> list[str]:
    names = []
    for layer in range(1, num_layers + 1):
        names += [f"{k}{layer}" for k in ("FAEGU" if layer > 1 else "FAGU")]
    return names


@st.composite
def placements(draw: st.DrawFn, max_layers: int = 3, max_pes: int = 4, max_width: int = 6,
               lanes: tuple[int, ...] = (1, 2, 4)) -> tuple[list[int], dict[str, int], int, int]:
    """(widths, task → PE, N, lanes): a random MLP and a random placement of its tasks on N ≤ `max_pes` PEs.

    Matrix transfers need widths the lanes divide (`compile_program` refuses the others, tested apart), so
    for lanes > 1 the widths are drawn as multiples of the lanes.
    """
    v = draw(st.sampled_from(lanes))
    layers = draw(st.integers(2, max_layers))
    widths = [v * draw(st.integers(1, max(1, max_width // v))) for _ in range(layers + 1)]
    n = draw(st.integers(2, max_pes))
    where = {name: draw(st.integers(0, n - 1)) for name in task_names(layers)}
    return widths, where, n, v
