"""`layerpipe rtl NETWORK --policy NAME -n N --lanes V [--samples T] --out DIR`: generate the accelerator.

Schedules the MLP with the policy under the `rtl` cost model, compiles the periodic schedule to per-PE
microcode and writes to DIR:

- `layerpipe_accel.v` — the Verilog of the whole accelerator (deterministic: no source locations);
- `microcode.txt`     — every PE's memory map and microcode, as text;
- `design.json`       — the design point, the memory per PE, and the simulator's cycle prediction;
- `synth.json`        — yosys `synth` / `synth_ice40` statistics, when yosys is installed (skip: --no-synth);
                        with `--part PART` the FPGA flow's instead (hdl/_fpga.py: yosys + nextpnr place and
                        route): utilization per resource, DSP/BRAM mapping, Fmax after routing, samples/s.
                        A design that does not fit the part is one line on stderr and exit 2.

The hardware runs asynchronous layer-level periodic schedules (policies layerpipe and pipedream) of MLPs
(linear layers without bias, ReLU hidden, identity output, micro-batches of --batch B samples), with a layer's
tasks on any PEs (`--no-keep-weights-together`: weight versions and gradients cross the links). Anything else
exits 2 naming the limit.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from layerpipe._files import check_output_folder, owns_names, staged_folder, write_atomic
from layerpipe.commands._common import ArgumentValueError, format_table, int_in, positive_int, to_json
from layerpipe.commands._names import FPGA_PARTS, FPGA_ROUTERS
from layerpipe.errors import InputError


def add_design_args(p: argparse.ArgumentParser) -> None:
    """Arguments shared by `rtl` and `verify`: the design point."""
    p.add_argument("network", help="mlp:W0-W1-..., lenet5, or FILE.yaml of a chain of linear, conv2d, pooling and "
                   "flatten layers")
    p.add_argument("--policy", required=True, help="layerpipe or pipedream (the policies the hardware runs)")
    p.add_argument("-n", "--num-procs", dest="num_procs", type=positive_int("-n/--num-procs"), required=True,
                   help="number of processing elements N")
    p.add_argument("--lanes", type=positive_int("--lanes"), required=True, help="multipliers per PE")
    p.add_argument("--keep-weights-together", action=argparse.BooleanOptionalAction, default=True,
                   help="layerpipe: place a layer's F, E, G, U on one PE (default; with --no-keep-weights-together "
                   "the hardware streams weight versions and gradients between PEs)")
    p.add_argument("--split-layers", action=argparse.BooleanOptionalAction, default=False,
                   help="layerpipe: let the policy split a heavy first layer over PEs (its parts concatenated where "
                   "their consumer reads them, hdl/_split.py); off by default")
    p.add_argument("--batch", type=positive_int("--batch"), default=1,
                   help="micro-batch B: samples per iteration (G sums over them, one U per micro-batch; default 1)")
    p.add_argument("--lr-shift", type=int, default=4, help="learning rate 2^-K (default K = 4)")
    p.add_argument("--stream-bits", type=int_in("--stream-bits", 1, 1024), default=8,
                   help="data bits per beat of the host's two streams (samples in, weights out; default 8): a wider "
                   "stream costs I/O pins and loads a sample in fewer cycles")
    p.add_argument("--csr-bits", type=int_in("--csr-bits", 4, 32), default=4,
                   help="data bits of the host's control/status register bus (default 4)")
    p.add_argument("--sample-depth", type=_power_of_two("--sample-depth"), default=None,
                   help="iterations the on-chip sample rings hold while the host refills them (a power of two; "
                   "default the smallest that leaves the host an iteration of slack, at most T's)")


def _power_of_two(field: str):
    def parse(text: str) -> int:
        value = positive_int(field)(text)
        if value & (value - 1):
            raise ArgumentValueError(f"{field} must be a power of two (1, 2, 4, ...), got {value}")
        return value

    return parse


def make_design_from_args(args: argparse.Namespace, samples: int) -> Any:
    from layerpipe.fixedpoint import check_lr_shift
    from layerpipe.hdl._flow import make_design
    from layerpipe.hdl._host import HostConfig

    return make_design(args.network, args.policy, args.num_procs, args.lanes, samples,
                       lr_shift=check_lr_shift(args.lr_shift), keep_weights_together=args.keep_weights_together,
                       batch=args.batch, split_layers=args.split_layers, sample_depth=args.sample_depth,
                       host=HostConfig(stream_bits=args.stream_bits, csr_bits=args.csr_bits))


#: Every file `rtl --out` writes: an existing folder holding anything else is refused, never deleted.
RTL_OUTPUTS = owns_names("layerpipe_accel.v", "microcode.txt", "design.json", "synth.json")


def _output_dir(text: str) -> str:
    try:
        return check_output_folder(text, RTL_OUTPUTS, "design.json", "layerpipe rtl output")
    except InputError as exc:
        raise ArgumentValueError(str(exc)) from None


# The names, not the FPGA flow's tables: a bad --part is a parse error, and importing hdl/_fpga.py for it
# (hashlib, importlib.metadata) cost ~30 ms of the error's start.
def _part_name(text: str) -> str:
    if text not in FPGA_PARTS:
        raise ArgumentValueError(f"must be one of {', '.join(FPGA_PARTS)}, got '{text}'")
    return text


def _router_name(text: str) -> str:
    if text not in FPGA_ROUTERS:
        raise ArgumentValueError(f"must be one of {', '.join(FPGA_ROUTERS)}, got '{text}'")
    return text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rtl", help="generate the Verilog and microcode of an N-PE training accelerator",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_design_args(p)
    p.add_argument("--samples", type=positive_int("--samples"), default=64,
                   help="sample memory capacity T_max (default 64)")
    p.add_argument("--out", required=True, type=_output_dir,
                   help="output directory (new, empty or an earlier run's; replaced atomically)")
    p.add_argument("--no-synth", action="store_true", help="do not run yosys even when it is installed")
    p.add_argument("--part", default=None, type=_part_name, help="FPGA part for synthesis, place and route: "
                   f"{', '.join(FPGA_PARTS)} (default: yosys statistics only)")
    p.add_argument("--freq", type=float, default=None,
                   help="nextpnr target frequency in MHz with --part (default 100; Fmax is reported either way)")
    p.add_argument("--router", default=None, type=_router_name,
                   help="nextpnr's router with --part: router2 (default: finishes in minutes) or router1 (8-15 %% "
                   "higher Fmax on the report's designs, but it can route for an hour: hdl/_fpga.py)")
    p.set_defaults(handler=run)


def design_summary(design: Any) -> dict[str, Any]:
    """The design point and its memory map sizes, JSON-ready."""
    prog = design.program
    sim = design.sim
    return {
        "network": design.network.name, "policy": design.policy, "num_pes": design.num_pes, "lanes": design.lanes,
        "samples": design.samples, "lr_shift": design.lr_shift, "weight_mode": prog.weight_mode,
        "period_cycles": prog.period, "cycles_sim": int(sim.total_cycles),
        "cycles_per_sample_sim": round(float(sim.cycles_per_sample), 3),
        "links": [list(link) for link in prog.links()],
        "host": {"stream_bits": design.host.stream_bits, "csr_bits": design.host.csr_bits,
                 "sample_depth": design.sample_depth},
        "pes": [{"pe": pe.index, "entries": len(pe.entries),
                 "memory_words": {m: pe.memory_words(m) for m in pe.memories}} for pe in prog.pes],
    }


def run(args: argparse.Namespace) -> int:
    from layerpipe.commands._common import require_extras

    require_extras("rtl", "hdl")
    from layerpipe.hdl._flow import TOPLEVEL, export_verilog

    design = make_design_from_args(args, args.samples)
    out = Path(args.out)
    verilog = export_verilog(design)
    summary = design_summary(design)
    synth_note = "skipped (--no-synth)"
    fpga = None
    with staged_folder(out, RTL_OUTPUTS) as tmp:  # the old folder or the whole new one, never a mix
        write_atomic(tmp / f"{TOPLEVEL}.v", verilog)
        write_atomic(tmp / "microcode.txt", design.program.to_text())
        write_atomic(tmp / "design.json", to_json(summary))
        if args.part is not None and not args.no_synth:
            fpga, synth_note = _place_and_route(verilog, args.part, args.freq, args.router, summary,
                                                tmp / "synth.json")
        elif not args.no_synth:
            synth_note = _synthesize(tmp / f"{TOPLEVEL}.v", tmp / "synth.json")
    rows = [[pe["pe"], pe["entries"], sum(pe["memory_words"].values())] for pe in summary["pes"]]
    print(f"{summary['network']} {design.policy} N={design.num_pes} lanes={design.lanes}: period "
          f"{summary['period_cycles']} cycles, {summary['cycles_sim']} cycles for {design.samples} samples "
          f"(simulator), links {summary['links'] or 'none'}; synth: {synth_note}")
    print(format_table(["pe", "entries", "memory_words"], rows), end="")
    print(f"wrote {out}")
    if fpga is not None and not fpga.fits:
        raise InputError(fpga.misfit_line())  # the files are written; the verdict is the exit status
    return 0


def _place_and_route(verilog: str, part_name: str, freq: float | None, router: str | None, summary: dict[str, Any],
                     target: Path) -> tuple[Any, str]:
    """The FPGA flow (hdl/_fpga.py) on `part_name`; writes its figures and samples per second to `target`."""
    from layerpipe.hdl._fpga import DEFAULT_FREQ_MHZ, DEFAULT_ROUTER, get_part, run_fpga_flow, terminal_progress

    try:
        result = run_fpga_flow(verilog, get_part(part_name), freq_mhz=DEFAULT_FREQ_MHZ if freq is None else freq,
                               progress=terminal_progress(), router=router or DEFAULT_ROUTER)
    except RuntimeError as failure:  # a tool failed: its one line (pass and ERROR), nothing written
        raise InputError(str(failure).splitlines()[0]) from None
    doc = result.to_dict()
    rate = result.samples_per_second(summary["cycles_per_sample_sim"])
    doc["cycles_per_sample_sim"] = summary["cycles_per_sample_sim"]
    doc["samples_per_second"] = round(rate, 1) if rate is not None else None
    write_atomic(target, to_json(doc))
    note = result.summary() + (f"; {rate:,.0f} samples/s at Fmax" if rate is not None else "")
    return result, note + (" (cached)" if result.cached else "")


def _synthesize(verilog: Path, target: Path) -> str:
    """yosys statistics through the hdl package's synthesis flow, when yosys is installed."""
    if shutil.which("yosys") is None:
        return "yosys not installed"
    from layerpipe.hdl import synthesize

    stats = synthesize(verilog)
    write_atomic(target, to_json(stats))
    return f"wrote {target.name}"
