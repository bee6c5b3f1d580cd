"""Mutation check of the accelerator (issue 11, Done-when): each mutant class must be killed by the suite.

A mutant is one source edit of `hdl/` (a string replacement that must apply exactly once), made in a fresh
interpreter: the module's source is edited in memory and re-executed in its own namespace, and every
`layerpipe` module that imported a replaced name is pointed at the new one, so the files on disk never
change (other developers share the working tree). The mutant then faces the checks a developer runs:

- `compiler` — `tests/test_compiler.py`'s consistency check against the simulator (versions read, ring
  depths against the simulator's timing) on a split placement with micro-batches;
- `pe`       — the PE unit tests (`tests/test_pe.py`: every op against `layerpipe.fixedpoint`);
- `rtl`      — the whole accelerator on Icarus (cocotb bench: plain run, random stalls on every link and the
  loader, back-to-back runs) on two designs: a split placement (weight copies, stash, gradients over links)
  with B = 2, and mlp:7-6-5-3 on 2 PEs with 4 lanes (widths that leave padding lanes).

The mutant is killed when any check fails; a control run without an edit must pass them all first.
Usage: `python benchmarks/mutants.py [NAME ...]` (all by default); prints one line per mutant and exits 1
if one survives. Needs torch, cocotb and Icarus; about 30 s a mutant.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  #: dotted module the edit applies to
    old: str
    new: str
    why: str  #: what the mutant breaks


MUTANTS = (
    Mutant("ignored-arrival-counters", "layerpipe.hdl._sequencer", "ready_in.eq(_all(waits))", "ready_in.eq(1)",
           "an op starts before its inputs arrive"),
    Mutant("off-by-one-waits", "layerpipe.hdl._sequencer", "(counts[k] > thr[k])", "(counts[k] >= thr[k])",
           "an op waits for one transfer too few"),
    Mutant("relu-mask", "layerpipe.hdl._datapath", "Mux(y > 0, x, 0)", "Mux(y >= 0, x, 0)",
           "f'(0) = 1 instead of 0"),
    Mutant("wrap-instead-of-saturate", "layerpipe.hdl._datapath",
           "clamped = Mux(fits, value[:width], Mux(value[-1], lo, hi))", "clamped = value",
           "results wrap around instead of saturating"),
    Mutant("narrowed-accumulator", "layerpipe.hdl._pe",
           "return min(64, 2 * self.fmt.total_bits + self.max_dim.bit_length())",
           "return self.fmt.total_bits", "sums of products overflow the accumulator"),
    Mutant("wrong-weight-version", "layerpipe.hdl._compiler", "            return ring, offset\n",
           "            return ring, offset - 1\n", "F reads the version before the one the simulator says"),
    Mutant("halved-rings", "layerpipe.hdl._compiler", "return _pow2_at_least(max(pairs, default=1))",
           "return max(1, _pow2_at_least(max(pairs, default=1)) // 2)",
           "a vector slot is rewritten before its last reader"),
    Mutant("first-beat-arrival", "layerpipe.hdl._link", "last_r.eq(last_beat & busy)", "last_r.eq((beat == 0) & busy)",
           "a transfer counts as arrived after its first beat"),
    Mutant("uncleared-counters", "layerpipe.hdl._sequencer",
           "            for count in counts:\n                m.d.sync += count.eq(0)\n", "",
           "a second start keeps the first run's arrival counts"),
    Mutant("padding-mask", "layerpipe.hdl._pe", "mask.eq(Cat(col_elem + j < cmd.cols for j in range(lanes)))",
           "mask.eq(Cat(1 for j in range(lanes)))", "padding lanes of a row's last word are not zeroed"),
    Mutant("floor-instead-of-round", "layerpipe.hdl._datapath",
           "widened = value + Const(1 << (shift - 1), unsigned(shift))", "widened = value",
           "rescaling truncates instead of rounding half up"),
    Mutant("gradient-not-summed-over-batch", "layerpipe.hdl._datapath",
           "m.d.sync += acc[j].eq(Mux(s_acc.first, 0, acc[j]) + addend[j])",
           "m.d.sync += acc[j].eq(Mux(s_acc.first | (s_acc.op == Opcode.GRAD), 0, acc[j]) + addend[j])",
           "G keeps only the micro-batch's last sample"),
)

#: Runs in the child interpreter: apply one mutant, then the checks; prints KILLED <check> or SURVIVED.
CHILD = r'''
import importlib, inspect, sys, tempfile
from pathlib import Path
sys.path.insert(0, ROOT)
module = importlib.import_module(MODULE)
source = inspect.getsource(module)
assert OLD == "" or source.count(OLD) == 1, f"the edit must apply exactly once, found {source.count(OLD)}"
before = dict(vars(module))
if OLD:
    exec(compile(source.replace(OLD, NEW), module.__file__, "exec"), vars(module))
    # Definitions the edit did not touch keep their identity (an enum re-created would differ from the one
    # other modules hold, and "kill" the mutant for the wrong reason): only the edited class/function is new.
    for name, old in before.items():
        if vars(module).get(name) is old:
            continue
        try:
            text = inspect.getsource(old)
        except (TypeError, OSError):
            text = None
        if text is None or OLD not in text:
            vars(module)[name] = old
for other in list(sys.modules.values()) if OLD else ():
    if getattr(other, "__name__", "").startswith("layerpipe") and other is not module:
        for key, value in list(vars(other).items()):
            for name, old in before.items():
                if value is old and vars(module).get(name) is not old and not name.startswith("__"):
                    setattr(other, key, vars(module)[name])

def killed(check):
    print("KILLED", check, flush=True)
    sys.exit(0)

from tests.rtl_placements import placed_design
from layerpipe.hdl._flow import export_verilog, make_design, run_bench, write_vectors
where = {"F1": 1, "A1": 0, "G1": 0, "U1": 0, "F2": 1, "A2": 1, "E2": 0, "G2": 0, "U2": 1}
try:
    from tests.test_compiler import _check_design
    split = placed_design([4, 4, 2], where, 2, 2, 6, batch=2)
    _check_design(split)
except Exception as exc:
    killed(f"compiler ({type(exc).__name__})")
import pytest
if pytest.main(["-q", "-x", "-p", "no:cacheprovider", str(Path(ROOT) / "tests" / "test_pe.py")]) != 0:
    killed("pe")
for label, design in (("split", split), ("padded", make_design("mlp:7-6-5-3", "layerpipe", 2, 4, 5))):
    with tempfile.TemporaryDirectory(prefix="layerpipe-mutant-") as tmp:
        tmp = Path(tmp)
        try:
            (tmp / "accel.v").write_text(export_verilog(design, debug=True))  # run_stalled drives the taps
            write_vectors(design.vectors(3), tmp / "vectors.json")
        except Exception as exc:
            killed(f"rtl {label} build ({type(exc).__name__})")
        run = run_bench(tmp / "accel.v", tmp / "vectors.json", tmp / "build", sim="icarus",
                        testcases=("run_plain", "run_stalled", "run_back_to_back"), stall=0.3)
        if not run.passed:
            killed(f"rtl {label} ({run.failed} of {run.tests} bench cases failed)")
print("SURVIVED", flush=True)
'''


def run_mutant(mutant: Mutant) -> tuple[str, float]:
    code = (f"ROOT = {str(ROOT)!r}\nMODULE = {mutant.module!r}\nOLD = {mutant.old!r}\nNEW = {mutant.new!r}\n"
            + CHILD)
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    verdict = next((line for line in proc.stdout.splitlines() if line.startswith(("KILLED", "SURVIVED"))), None)
    if verdict is None:  # the mutant did not even run (e.g. the edit no longer applies): say so
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        verdict = f"ERROR {tail}"
    return verdict, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"mutants to run (default all: {', '.join(m.name for m in MUTANTS)})")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        print(f"unknown mutants: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    # The control: the unmutated design must pass every check, or "killed" would mean nothing.
    control, seconds = run_mutant(Mutant("control", "layerpipe.hdl._pe", "", "", "no edit"))
    print(f"{'control (no edit)':<32} {control:<48} {seconds:6.1f} s", flush=True)
    if control != "SURVIVED":
        print("the unmutated design fails its checks: nothing is measured", file=sys.stderr)
        return 2
    survived = 0
    for mutant in chosen:
        verdict, seconds = run_mutant(mutant)
        survived += not verdict.startswith("KILLED")
        print(f"{mutant.name:<32} {verdict:<48} {seconds:6.1f} s  ({mutant.why})", flush=True)
    print(f"{len(chosen) - survived} of {len(chosen)} mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
