"""From a network and a policy to a verified accelerator: schedule, compile, time, expect, and the host protocol.

`make_design(network, policy, num_pes, lanes, samples)` schedules the network with the policy under the `rtl`
cost model, compiles the periodic schedule (`compile_program`) and keeps everything a bench or the CLI needs.
`Design.simulate()` times the same ops with the Python simulator under `rtl_sim_config` — the cycle count the
RTL must reproduce — and `Design.vectors(seed)` computes, with the integer PyTorch reference, the final
weights the RTL must reproduce bit for bit, as a JSON-ready document (`write_vectors`). The benches read
that file, so torch never runs in the simulator process.

Host protocol (`hdl/_host.py`, the register map in the vectors' `host`): weights are streamed in as rows of
⌈n_in/lanes⌉ words at version 0's slot of W_l's ring on its owner PE and streamed out from version T's slot;
samples stream as x(t) words then y(t) words, into sample rings of `sample_depth` iterations (a power of two,
by default the smallest above the deadlock bound `min_sample_depth`) refilled during the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from layerpipe._rtl_costs import RTLCostModel
from layerpipe.errors import InputError
from layerpipe.fixedpoint import FixedFormat
from layerpipe.hdl._compiler import SUPPORTED_POLICIES, check_lanes, compile_program, mlp_widths
from layerpipe.hdl._conv import matrix_shape
from layerpipe.hdl._host import HostConfig
from layerpipe.hdl._program import Program, ceil_div
from layerpipe.interconnect import Interconnect
from layerpipe.network import Network, load_network

__all__ = ["Design", "make_design", "steady_design", "write_vectors"]

DEFAULT_LR_SHIFT = 4


@dataclass(frozen=True)
class Design:
    """A scheduled and compiled accelerator for one (network, policy, N, lanes, T) point: T iterations of
    micro-batches of `network.batch` samples (T·B samples in all)."""

    network: Network
    policy: str
    num_pes: int
    lanes: int
    samples: int
    lr_shift: int
    schedule: Any  #: the policy's `ScheduleResult`
    program: Program
    host: HostConfig = field(default_factory=HostConfig)  #: the host interface's widths

    @property
    def sample_depth(self) -> int:
        """Iterations the on-chip sample rings hold (the host refills them during the run)."""
        from layerpipe.hdl._top import sample_depth

        return sample_depth(self.program)

    def host_map(self) -> dict[str, Any]:
        """The host interface as a driver needs it: widths, beats per word, the CSR register map."""
        from layerpipe.hdl._top import Accelerator

        acc = Accelerator(self.program, self.lr_shift, self.host)
        acc._MustUse__silence = True  # only its port layout is wanted here (no UnusedElaboratable warning)
        words = self.network.batch * (ceil_div(self.program.widths[0], self.lanes)
                                      + ceil_div(self.program.widths[-1], self.lanes))
        # The host keeps up (and the run takes the simulator's cycles) only if an iteration's samples stream
        # in within about a period: beats_per_iteration against the period is the first thing to check.
        return {"stream_bits": self.host.stream_bits, "beats_per_word": acc.beats_per_word,
                "beats_per_iteration": words * acc.beats_per_word, "sample_depth": acc.sample_depth,
                **acc.register_map.to_json()}

    @property
    def fmt(self) -> FixedFormat:
        return self.program.fmt

    def simulate(self) -> Any:
        """The Python simulator's run of the same T iterations under the `rtl` cost model (a `SimResult`)."""
        from layerpipe.hdl._top import rtl_sim_config
        from layerpipe.sim import Workload, simulate

        workload = Workload.of_graph(self.schedule.graph, RTLCostModel(self.lanes))
        config = rtl_sim_config(self.lanes, self.program.weight_mode)
        return simulate(self.schedule.periodic.unroll(self.samples), workload, config)

    @cached_property
    def sim(self) -> Any:
        return self.simulate()

    def vectors(self, seed: int) -> dict[str, Any]:
        """Inputs and expected outputs of a run, from the integer PyTorch reference (imports torch)."""
        from layerpipe.reference import expected_fixed_run

        sim = self.sim
        rows = self.samples * self.network.batch
        expected = expected_fixed_run(self.network, sim.version_map, rows, seed, self.fmt, self.lr_shift,
                                      self.program.weight_mode)
        float_final = _float_reference(self, sim.version_map, seed)
        prog, lanes = self.program, self.lanes
        layers = []
        for index in range(1, prog.num_layers + 1):
            if not self.network.layer(index).has_weights:
                continue  # pooling, flatten
            owner = prog.pes[prog.owner(index)]
            ring = owner.buffer(f"W{index}")
            # The PE's matrix of W: linear (n_out, n_in), conv2d (O, C·K·K) — row o is W[o] flattened; a split
            # layer's consumer in the padded column layout (`stored_weights`).
            m_rows, m_cols = matrix_shape(self.network.layer(index))

            def stored(matrix: Any, index: int = index, shape: tuple[int, int] = (m_rows, m_cols)) -> Any:
                return self.stored_weights(index, matrix.reshape(shape))

            init = stored(expected[f"init_W{index}"])
            cols = init.shape[1]
            layers.append({
                "layer": index, "pe": owner.index, "rows": m_rows, "cols": cols,
                "row_words": ceil_div(cols, lanes), "init_addr": ring.address(0),
                "final_addr": ring.address(self.samples),
                # Received copies of W (F / E away from the owner) start from version 0 too.
                "copies": [[pe, buf.address(0)] for pe, buf in prog.weight_copies(index)],
                "init": init.tolist(),
                "final": stored(expected[f"final_W{index}"]).tolist(),
                "final_float": stored(float_final[f"W{index}"]).tolist(),
            })
        return {
            "version": 1, "network": self.network.name, "policy": self.policy, "num_pes": self.num_pes,
            "lanes": lanes, "total_bits": self.fmt.total_bits, "frac_bits": self.fmt.frac_bits,
            "lr_shift": self.lr_shift, "samples": self.samples, "batch": self.network.batch, "seed": seed,
            "x": expected["x"].reshape(rows, -1).tolist(),
            "y": expected["y"].reshape(rows, -1).tolist(),
            "layers": layers, "cycles_sim": int(sim.total_cycles), "max_samples": prog.max_samples,
            "links": [list(link) for link in prog.links()],
            "trace": self.expected_trace(), "link_traffic": self.expected_link_traffic(), "host": self.host_map(),
            "commands": sum(len(op.kind) for op in sim.schedule.ops()),  # one PE command per atomic step
        }


    def stored_weights(self, layer: int, matrix: Any) -> Any:
        """W_layer as the hardware stores it: as is, or (a split layer's consumer) with the parts' columns padded
        to whole words (`hdl/_split.py`)."""
        import numpy as np

        from layerpipe.hdl._split import pad_columns, split_shapes

        shapes = split_shapes(self.network, self.lanes)
        if layer not in shapes.segments:
            return np.asarray(matrix)
        rows = [self.network.layer(part).out_size for part, _, _ in shapes.segments[layer]]
        return pad_columns(matrix, shapes.segments[layer], rows, self.lanes)

    def expected_trace(self) -> list[list[list[int]]]:
        """Per PE, the simulator's op trace as the monitor sees it: [entry index, iteration, start cycle] in
        issue order (the entry's first command issues in the op's start cycle)."""
        prog, sim = self.program, self.sim
        index = {(pe.index, e.kind, e.layer): i for pe in prog.pes for i, e in enumerate(pe.entries)}
        trace: list[list[list[int]]] = [[] for _ in prog.pes]
        for op, start in zip(sim.ops, sim.start, strict=True):
            trace[op.proc].append([index[(op.proc, op.kind, op.unit)], op.iteration, int(start)])
        for ops in trace:
            ops.sort(key=lambda e: e[2])
        return trace

    def expected_link_traffic(self) -> list[list[int]]:
        """Per link (`program.links()` order), [transfers, beats] of the run: one transfer per send of every op
        whose consumer iteration t + delay is < T, ⌈elements/lanes⌉ beats each."""
        prog = self.program
        links = {link: [0, 0] for link in prog.links()}
        for pe in prog.pes:
            for entry in pe.entries:
                for t in range(self.samples):
                    for send in entry.sends:
                        if t + send.delay < self.samples:
                            links[(pe.index, send.dest)][0] += 1
                            links[(pe.index, send.dest)][1] += pe.buffer(send.src).slot_words
        return [links[link] for link in prog.links()]


def _float_reference(design: Design, versions: dict, seed: int) -> dict[str, Any]:
    """Final weights of the float64 reference on the same data, versions and initial weights."""
    from layerpipe.numerics import init_weights, make_data
    from layerpipe.reference import train_reference

    init = {k: design.fmt.to_float(v) for k, v in init_weights(design.network, seed, design.fmt).items()}
    data = make_data(design.network, design.samples * design.network.batch, seed)
    result = train_reference(design.network, init, data, versions, design.program.weight_mode,
                             2.0 ** -design.lr_shift, None, iterations=design.samples)
    return result.weights


def make_design(network: Network | str, policy: str, num_pes: int, lanes: int, samples: int, *,
                lr_shift: int = DEFAULT_LR_SHIFT, keep_weights_together: bool = True, batch: int = 1,
                split_layers: bool = False, sample_depth: int | None = None,
                host: HostConfig | None = None) -> Design:
    """Schedule `network` with `policy` on `num_pes` PEs under the `rtl` cost model and compile it; `samples`
    is T, the iterations (micro-batches of `batch` samples) of a run, streamed in through sample rings of
    `sample_depth` iterations (see `_compile`). `split_layers` lets `layerpipe` pick its heavy-layer split
    variants (`hdl/_split.py`); the design's network is then the variant."""
    net, result = _schedule(network, policy, num_pes, lanes, keep_weights_together, batch, split_layers)
    program = _compile(net, result, lanes, samples, policy, sample_depth)
    return Design(net, policy, num_pes, lanes, samples, lr_shift, result, program, host or HostConfig())


def _compile(net: Network, result: Any, lanes: int, samples: int, policy: str, sample_depth: int | None) -> Program:
    """The program with sample rings of `sample_depth` iterations: a power of two, at least `min_sample_depth`
    (below it the in-order sequencers would deadlock) unless it holds all T; by default the smallest power of
    two above that bound (one iteration of slack for the host's refill), at most T's."""
    from layerpipe.hdl._program import pow2_at_least
    from layerpipe.hdl._top import min_sample_depth

    whole = pow2_at_least(samples)
    probe = compile_program(net, result.graph, result.periodic, lanes, samples, policy=policy, sample_depth=1)
    bound = min_sample_depth(probe)
    if sample_depth is None:
        sample_depth = min(whole, pow2_at_least(bound + 1))
    elif (not isinstance(sample_depth, int) or isinstance(sample_depth, bool) or sample_depth < 1
          or sample_depth & (sample_depth - 1)):
        raise InputError(f"the sample buffer depth must be a power of two, got {sample_depth!r}")
    elif sample_depth < min(bound, samples):
        raise InputError(f"a sample buffer of {sample_depth} iterations deadlocks this schedule: G_1(t) frees x(t)'s "
                         f"slot {bound - 1} periods after F_1(t) reads it; use at least {pow2_at_least(bound)}")
    sample_depth = min(sample_depth, whole)
    if sample_depth == 1:
        return probe
    return compile_program(net, result.graph, result.periodic, lanes, samples, policy=policy,
                           sample_depth=sample_depth)


def steady_design(network: Network | str, policy: str, num_pes: int, lanes: int, *, lr_shift: int = DEFAULT_LR_SHIFT,
                  keep_weights_together: bool = True, batch: int = 1, fewest: int = 4, most: int = 64,
                  split_layers: bool = False, sample_depth: int | None = None,
                  host: HostConfig | None = None) -> Design:
    """`make_design` with the fewest iterations T (at least `fewest`) whose run has a steady middle, so that the
    RTL's steady-state period is measurable (`cocotb_accel.measured_period`): measured on the simulator's op
    trace, which a cycle-exact RTL run reproduces issue for issue, it must equal the schedule's period. The
    network is scheduled once; each T only recompiles and resimulates. InputError when no T up to `most` is."""
    from layerpipe.hdl.cocotb_accel import measured_period

    net, result = _schedule(network, policy, num_pes, lanes, keep_weights_together, batch, split_layers)
    for samples in range(max(fewest, 4), most + 1):
        program = _compile(net, result, lanes, samples, policy, sample_depth)
        design = Design(net, policy, num_pes, lanes, samples, lr_shift, result, program, host or HostConfig())
        measured = measured_period(design.expected_trace())
        if measured is not None and measured["period_rtl"] == program.period:
            return design
    raise InputError(f"{net.name} on {num_pes} PEs, {lanes} lanes: no run of {fewest}..{most} iterations has a "
                     "steady middle")


def _schedule(network: Network | str, policy: str, num_pes: int, lanes: int, keep_weights_together: bool,
              batch: int, split_layers: bool = False) -> tuple[Network, Any]:
    """The network the hardware runs (the policy's split variant of it, if it picks one) and the policy's
    schedule of it (see `make_design`)."""
    from layerpipe.schedule.policies import POLICIES, get_policy, make_schedule, policy_options

    if policy not in SUPPORTED_POLICIES:
        known = "" if policy in POLICIES else " (not a known policy)"
        raise InputError(f"policy '{policy}'{known} cannot run on the RTL; supported: {', '.join(SUPPORTED_POLICIES)} "
                         "(asynchronous layer-level periodic schedules)")
    check_lanes(lanes)
    net = load_network(network, batch) if isinstance(network, str) else network
    mlp_widths(net)  # refuse what the hardware cannot run before scheduling it
    # The hardware runs one iteration per period: PipeDream's straight pipeline (its replicas unfold iterations
    # over PEs, J > 1), LayerPipe's placements — with its heavy-layer split variants when `split_layers`
    # (`hdl/_split.py`: the first layer's parts concatenated where their consumer reads them) — on the rtl
    # interconnect it is timed on.
    # (An option the policy does not have yet is left out: `replication` for layerpipe would keep it to one
    # iteration per period instead of refusing its replicated placements below.)
    wanted: dict[str, object] = {"replication": False}
    if policy == "layerpipe":
        wanted.update(keep_weights_together=keep_weights_together, split_layers=split_layers)
    names = get_policy(policy).option_names
    given = {k: v for k, v in wanted.items() if k in names}
    result = make_schedule(policy, net, num_pes, RTLCostModel(lanes), policy_options(policy, given),
                           interconnect=Interconnect.rtl(lanes))
    if result.periodic is None or result.graph is None:
        raise InputError(f"policy '{policy}' gave no periodic layer-level schedule; the RTL runs only those")
    check_runnable(net, result, policy)
    return result.graph.network, result


def check_runnable(net: Network, result: Any, policy: str) -> None:
    """Refuse, in one line naming the tasks and why, a schedule the hardware cannot run: a split variant the PE
    cannot combine (`split_shapes`: a split layer with an E, micro-batches) or a replicated placement (several
    iterations per period)."""
    from layerpipe.hdl._split import split_shapes

    scheduled = result.graph.network
    if scheduled is not net:
        try:
            split_shapes(scheduled, 1)  # its refusals do not depend on the lanes
        except InputError as exc:
            raise InputError(f"policy {policy} picks a split variant here ({scheduled.name}) the RTL cannot run: "
                             f"{exc}; use --no-split-layers, another -n or --lanes") from None
    unfold = getattr(result.periodic, "unfold", 1)
    if unfold != 1:
        raise InputError(f"policy {policy} picks a replicated placement here ({unfold} iterations per period, a "
                         f"stage's iterations alternating over PEs); the RTL runs one iteration per period: use "
                         f"--keep-weights-together, another -n or --batch")


def write_vectors(doc: dict[str, Any], path: str | Path) -> None:
    from layerpipe._files import write_atomic

    write_atomic(path, json.dumps(doc, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------------------------
# Verilog and cocotb.

TOPLEVEL = "layerpipe_accel"


def export_verilog(design: Design, *, debug: bool = False) -> str:
    """The accelerator as Verilog (deterministic: no source locations); `debug` adds the cocotb bench's
    observation taps and stall injector (hdl/_top.py), never wanted on an FPGA."""
    from layerpipe.hdl._top import Accelerator
    from layerpipe.hdl._verilog import component_verilog

    return component_verilog(Accelerator(design.program, design.lr_shift, design.host, debug=debug), TOPLEVEL)


def run_bench(verilog_path: Path, vectors_path: Path, build_dir: Path, *, sim: str = "icarus",
              testcases: tuple[str, ...] = ("run_plain",), result_path: Path | None = None,
              stall: float | None = None) -> Any:
    """Build `verilog_path` with `sim` and run the accelerator bench's `testcases` (`layerpipe.hdl.cocotb_accel`)
    through the hdl package's cocotb runner; returns its `CocotbResult` (the log is `result.log`)."""
    from layerpipe.hdl._cocotb import run_cocotb

    env = {"LAYERPIPE_VECTORS": str(Path(vectors_path).resolve())}
    if result_path is not None:
        env["LAYERPIPE_RESULT"] = str(Path(result_path).resolve())
    if stall is not None:
        env["LAYERPIPE_STALL"] = str(stall)
    return run_cocotb(verilog_sources=[Path(verilog_path).resolve()], toplevel=TOPLEVEL,
                      test_module="layerpipe.hdl.cocotb_accel", build_dir=build_dir, simulator=sim, extra_env=env,
                      testcases=list(testcases))
