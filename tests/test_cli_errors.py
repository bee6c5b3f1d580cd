"""Bad input to the finished commands (graph, delays, schedule, compare, explore, report): exit status 2,
exactly one line on stderr that names the field and what is allowed, nothing on stdout, no output file.

Most cases run `layerpipe.cli.main` in-process; a few run the console entry point in a subprocess to check
what a user sees (no traceback) and the start-up import set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from layerpipe.cli import COMMAND_MODULES, COMMANDS, main
from tests.conftest import run_cli

FC = "  - {name: fc, type: linear, out_features: 2}\n"
YAML_FILES = {
    "dup.yaml": "version: 1\nname: a\nname: b\ninput_shape: [4]\nlayers:\n" + FC,
    "v2.yaml": "version: 2\nname: a\ninput_shape: [4]\nlayers:\n" + FC,
    "lstm.yaml": "version: 1\nname: a\ninput_shape: [4]\nlayers:\n  - {name: fc, type: lstm, out_features: 2}\n",
    "shape.yaml": ("version: 1\nname: a\ninput_shape: [4]\nlayers:\n" + FC +
                   "  - {name: fc2, type: linear, out_features: 3}\n  - {name: add, type: add, inputs: [fc, fc2]}\n"),
    "sweep_area.yaml": "version: 1\nnetworks: [mlp:7-6-3]\nnum_procs: [2]\npolicies: [layerpipe]\narea: \"no\"\n",
    "sweep_profiled.yaml": "version: 1\nnetworks: [mlp:7-6-3]\nnum_procs: [2]\npolicies: [layerpipe]\n"
                           "cost_model: profiled\n",
    "profile.json": json.dumps({"version": 1, "network": "mlp:7-6-3", "batch": 1, "unit": "ns", "layers": {
        "fc1": {"F": 5, "A": 1, "G": 5, "U": 2}, "fc2": {"F": 3, "A": 1, "E": 3, "G": 3, "U": 1}}}),
    "negative.json": json.dumps({"version": 1, "network": "mlp:7-6-3", "batch": 1, "layers": {"fc1": {"F": -5}}}),
}

#: Commands that take -o FILE: every case of theirs also asks for {out}, which must not appear.
WRITES_OUTPUT = {"graph", "delays", "schedule", "compare"}

# (argv with {tmp} for the fixture folder, words the one stderr line must contain)
CASES: list[tuple[list[str], list[str]]] = [
    ([], ["a COMMAND is required", "graph, delays, schedule"]),
    # networks
    (["graph", "nosuchnet"], ["unknown network 'nosuchnet'", "lenet5", "mlp:W0-W1-...", "FILE.yaml"]),
    (["graph", ""], ["unknown network ''", "allowed"]),
    (["graph", "mlp:7-0-3"], ["mlp widths", "positive"]),
    (["graph", "{tmp}/lstm.yaml"], ["unknown type 'lstm'", "linear", "conv2d"]),
    (["graph", "{tmp}/shape.yaml"], ["'add'", "one shape"]),
    (["graph", "{tmp}/dup.yaml"], ["duplicate key 'name'", "line 3"]),
    (["graph", "{tmp}/v2.yaml"], ["version must be 1"]),
    (["graph", "{tmp}/missing.yaml"], ["missing.yaml", "No such file"]),
    (["graph", "{tmp}"], ["Is a directory"]),
    # cost models: flags the chosen model ignores, and profiles of another network
    (["graph", "mlp:7-6-3", "--cost-model", "nope"], ["unknown cost model 'nope'", "macs, pe, profiled, rtl"]),
    (["graph", "mlp:7-6-3", "--profile", "{tmp}/profile.json"], ["--profile", "--cost-model profiled", "'pe'"]),
    (["graph", "mlp:7-6-3", "--cost-model", "macs", "--lanes", "4"], ["--lanes", "pe, rtl", "'macs'"]),
    (["graph", "mlp:7-6-3", "--cost-model", "rtl", "--overhead", "4"], ["--overhead", "--cost-model pe", "'rtl'"]),
    (["graph", "mlp:7-6-3", "--overhead", "-1"], ["--overhead", ">= 0"]),
    (["graph", "mlp:8-6-3", "--cost-model", "profiled", "--profile", "{tmp}/profile.json"],
     ["measured on network 'mlp:7-6-3'", "'mlp:8-6-3'"]),
    (["graph", "mlp:7-6-3", "--cost-model", "profiled", "--profile", "{tmp}/negative.json"],
     ["profile file", "nanoseconds >= 0"]),
    (["graph", "mlp:7-6-3", "--cost-model", "profiled", "--profile", "{tmp}/nope.json"], ["No such file"]),
    # stage maps
    (["delays", "lenet5", "--stages", "0,0,1"], ["--stages", "expected 8 stages", "got 3"]),
    (["delays", "lenet5", "--stages", "0,1,0,1,2,2,3,3"], ["--stages", "non-decreasing"]),
    (["delays", "lenet5", "--stages", "even:0"], ["--stages", "1 <= M <= 8"]),
    (["delays", "lenet5", "--stages", ""], ["--stages", "0,0,1,2", "even:M"]),
    # policies, N and policy options
    (["schedule", "mlp:7-6-3", "--policy", "nope", "-n", "2"], ["unknown policy 'nope'", "layerpipe, pipedream"]),
    (["schedule", "mlp:7-6-3", "--policy", "layerpipe", "-n", "0"], ["-n/--num-procs", ">= 1"]),
    (["schedule", "mlp:7-6-3", "--policy", "layerpipe", "-n", "100000000"], ["-n/--num-procs", "1..4096"]),
    (["schedule", "mlp:7-6-3", "--policy", "pipedream", "-n", "2", "--max-staleness", "2"],
     ["--max-staleness does not apply to policy 'pipedream'"]),
    (["schedule", "alexnet", "--policy", "optimal", "-n", "4"], ["optimal: graph has 47 tasks", "limit is 32"]),
    (["schedule", "mlp:7-6-3", "--policy", "layerpipe", "-n", "2", "--format", "yaml"],
     ["--format", "text", "torch-csv", "json"]),
    (["schedule", "mlp:7-6-3", "--policy", "layerpipe", "-n", "2", "--format", "torch-csv"],
     ["torch-csv is for stage-level", "text, csv or json"]),
    (["schedule", "--policy", "1f1b", "--stages", "4", "--stage-costs", "0,0,0"],
     ["--stage-costs", "F, B >= 1", "W >= 0"]),
    (["schedule", "--policy", "gpipe", "--stages", "1000", "--microbatches", "1000"], ["stage slots", "the limit is"]),
    (["schedule", "lenet5", "--policy", "layerpipe", "-n", "4", "--format", "csv", "--iterations", "100000000"],
     ["--iterations", "1..100000"]),
    # output files
    (["schedule", "mlp:7-6-3", "--policy", "layerpipe", "-n", "2", "-o", ""], ["-o/--output", "file path"]),
    (["schedule", "mlp:7-6-3", "--policy", "layerpipe", "-n", "2", "-o", "{tmp}"], ["-o/--output", "directory"]),
    (["schedule", "mlp:7-6-3", "--policy", "layerpipe", "-n", "2", "-o", "{tmp}/profile.json/x"], ["cannot write"]),
    # compare
    (["compare", "mlp:7-6-3", "-n", "1-100000000"], ["-n/--num-procs", "1..4096"]),
    (["compare", "mlp:7-6-3", "-n", "2", "--policies", ""], ["--policies must name at least one", "layerpipe"]),
    (["compare", "mlp:7-6-3", "-n", "2", "--baseline", "nope"], ["unknown policy 'nope'"]),
    (["compare", "mlp:7-6-3", "lenet5", "-n", "2", "--cost-model", "profiled", "--profile", "{tmp}/profile.json"],
     ["measured on network 'mlp:7-6-3'", "'lenet5'"]),
    # explore and report
    (["explore", "mlp:7-6-3", "-n", "2", "--policies", "", "--out", "{tmp}/r.csv", "--no-progress"],
     ["unknown policy ''", "layerpipe"]),
    (["explore", "mlp:7-6-3", "-n", "2", "--out", "{tmp}", "--no-progress"], ["--out", "directory"]),
    (["explore", "--sweep", "{tmp}/sweep_area.yaml", "--out", "{tmp}/r.csv", "--no-progress"],
     ["'area'", "true/false"]),
    (["explore", "--sweep", "{tmp}/sweep_profiled.yaml", "--out", "{tmp}/r.csv", "--no-progress"],
     ["cost_model", "macs, pe, rtl"]),
    (["report", "--no-rtl", "--no-progress", "--out", "{tmp}/profile.json"], ["--out", "must be a folder"]),
    (["report", "--no-rtl", "--no-progress", "--out", "{tmp}"], ["--out", "holds files but no layerpipe report"]),
    (["report", "--no-rtl", "--no-progress", "--out", "."], ["--out", "'.'"]),
]


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    for name, text in YAML_FILES.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _ids() -> list[str]:
    return [" ".join(argv)[:60] or "(no command)" for argv, _ in CASES]


@pytest.mark.parametrize(("argv", "words"), CASES, ids=_ids())
def test_bad_input_is_one_line_and_exit_2(argv: list[str], words: list[str], inputs: Path, capsys) -> None:
    args = [a.replace("{tmp}", str(inputs)) for a in argv]
    out = inputs / "out.txt"
    if argv and argv[0] in WRITES_OUTPUT and "-o" not in argv:
        args += ["-o", str(out)]
    before = sorted(p.name for p in inputs.iterdir())
    profile_bytes = (inputs / "profile.json").read_bytes()

    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("layerpipe: error: "), captured.err
    for word in words:
        assert word in lines[0], (word, lines[0])
    # nothing written or moved aside: no output file, no temporary file, the inputs untouched
    assert sorted(p.name for p in inputs.iterdir()) == before
    assert (inputs / "profile.json").read_bytes() == profile_bytes


@pytest.mark.parametrize("argv", [
    ["schedule", "mlp:7-6-3", "--policy", "layerpipe", "-n", "2", "-o", "/proc/no/such/dir/x"],
    ["schedule", "--policy", "1f1b", "--stages", "4", "--stage-costs", "0,0,0"],
    ["explore", "mlp:7-6-3", "-n", "2", "--out", "", "--no-progress"],
])
def test_subprocess_sees_one_line_and_no_traceback(argv: list[str]) -> None:
    proc = run_cli(*argv, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


#: What building the parser and `layerpipe --help` must not import (issue 14 item 3: numpy alone was ~90 ms of
#: a 250 ms start); the command modules are imported only when their subcommand runs.
HEAVY = ("numpy", "scipy", "networkx", "matplotlib", "amaranth", "torch", "yaml", "layerpipe.schedule",
         "layerpipe.sim", "layerpipe.network", "layerpipe.costs", "layerpipe.dfg", "layerpipe.retiming",
         "layerpipe.dse", "layerpipe.commands._common")


def _imported_after(code: str) -> set[str]:
    probe = (f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\n"
             "sys.stdout = sys.__stdout__\nprint(','.join(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(proc.stdout.strip().splitlines()[-1].split(","))


def test_parser_does_not_import_heavy_libraries() -> None:
    """Building the parser and printing `--help` imports no numeric library and no command module: scipy.optimize
    alone added ~0.5 s to each start when `optimal` imported it at module level, numpy ~90 ms."""
    loaded = _imported_after("import io; from layerpipe.cli import build_parser; sys.stdout = io.StringIO(); "
                             "build_parser().parse_args(['--help'])")
    assert not {m for m in loaded if m.startswith(HEAVY)}
    assert not {m for m in loaded if m.startswith("layerpipe.commands.")}


@pytest.mark.parametrize("command", COMMAND_MODULES)
def test_subcommand_help_imports_only_its_own_module(command: str) -> None:
    """`layerpipe CMD --help` imports CMD's module (and what it needs), never another command's."""
    loaded = _imported_after(f"import io; from layerpipe.cli import main; sys.stdout = io.StringIO(); "
                             f"main([{command!r}, '--help'])")
    assert f"layerpipe.commands.{command}" in loaded
    own = {f"layerpipe.commands.{command}"} | {f"layerpipe.commands.{m}" for m in ("_common", "_names", "schedule",
                                                                                    "rtl")}
    assert not {m for m in loaded if m.startswith("layerpipe.commands.") and m not in own}


#: Per command, argument errors argparse itself refuses (a missing required argument, a bad type, a bad choice),
#: before the handler runs. NETWORK and folder names are never read: the error comes first.
PARSE_ERRORS: dict[str, list[list[str]]] = {
    "graph": [[], ["mlp:4-4", "--format", "nope"], ["mlp:4-4", "--batch", "0"]],
    "delays": [["mlp:4-4"], ["mlp:4-4", "--stages", "even:2", "--weight-mode", "nope"]],
    "schedule": [[], ["mlp:4-4", "--policy", "layerpipe", "-n", "0"],
                 ["mlp:4-4", "--policy", "ooo", "-n", "2", "--allocation", "nope"]],
    "compare": [["mlp:4-4"], ["mlp:4-4", "-n", "x"], ["mlp:4-4", "-n", "2", "--format", "nope"]],
    "simulate": [[], ["mlp:4-4", "--policy", "nope"],
                 ["mlp:4-4", "--policy", "layerpipe", "--out", "o", "--functional", "nope"],
                 ["mlp:4-4", "--policy", "layerpipe", "--out", "o", "--samples", "0"]],
    "rtl": [[], *(["mlp:4-4", "--policy", "layerpipe", "-n", "2", "--lanes", "2", "--out", "o", *bad]
                  for bad in (["--part", "nope"], ["--router", "nope"], ["--sample-depth", "3"]))],
    "verify": [[], ["mlp:4-4", "--policy", "layerpipe", "-n", "2", "--lanes", "2", "--samples", "2", "--sim", "x"]],
    "explore": [[], ["--out", "o.csv", "-n", "x"]],
    "report": [["--out", ""]],
    "profile": [[], ["mlp:4-4", "--repeats", "0"]],
}
_POLICIES = ("layerpipe, pipedream, pipedream-2bw, gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zbv, dualpipev, "
             "looped-bfs, ooo, optimal, dp, dp-ooo, stream, stream-ooo")
#: Misspelt registry names, which the handlers check against the static names before importing the registries
#: (`_common.check_registry_names`), with the registry's own message. NETWORK and folders are never read.
NAME_ERRORS: list[tuple[list[str], str]] = [
    (["schedule", "mlp:4-4", "--policy", "nope", "-n", "2"], f"unknown policy 'nope'; allowed: {_POLICIES}"),
    (["schedule", "nonet", "--policy", "gpipe", "-n", "2", "--cost-model", "x"],
     "unknown cost model 'x'; allowed: macs, pe, profiled, rtl"),
    (["simulate", "nonet", "--policy", "nope", "-n", "2", "--out", "o"],
     f"unknown policy 'nope'; allowed: {_POLICIES}"),
    (["simulate", "nonet", "--policy", "gpipe", "-n", "2", "--out", "o", "--mode", "x"],
     "--mode 'x' is not one of stash, latest, ema"),
    (["simulate", "nonet", "--policy", "gpipe", "-n", "2", "--out", "o", "--cost-model", "x"],
     "unknown cost model 'x'; allowed: macs, pe, profiled, rtl"),
    (["compare", "nonet", "-n", "2", "--policies", "gpipe, nope"], f"unknown policy 'nope'; allowed: {_POLICIES}"),
    (["compare", "nonet", "-n", "2", "--policies", ","], f"--policies must name at least one of {_POLICIES}"),
    (["compare", "nonet", "-n", "2", "--cost-model", "x"], "unknown cost model 'x'; allowed: macs, pe, profiled, rtl"),
    (["explore", "nonet", "-n", "2", "--policies", "gpipe,nope", "--out", "o.csv"],
     f"unknown policy 'nope'; allowed: {_POLICIES}"),
]
#: What neither a subcommand's --help nor its argument errors may import (issue 14 item 3: `simulate --help` took
#: 130-300 ms CPU importing them to build its parser): the handlers import them when the command runs.
HEAVY_FOR_SUBCOMMANDS = (*(m for m in HEAVY if m != "layerpipe.commands._common"), "layerpipe.hdl", "tqdm")


def test_subcommand_help_and_argument_errors_import_no_heavy_library(tmp_path: Path) -> None:
    """Every subcommand's `--help`, its parse-time argument errors and misspelt registry names (`NAME_ERRORS`),
    all in one fresh process (one start, not one per case): each exits as before (0 for help; 2 with argparse's
    one line naming the command, or the registry's message), and then
    none of numpy, scipy, networkx, matplotlib, amaranth, torch, yaml, tqdm or the scheduling, simulator, RTL and
    DSE packages is loaded. The parsers take registry names from `layerpipe.commands._names`."""
    cases = [[name, "--help"] for name in COMMANDS] + [[name, *argv] for name, errors in PARSE_ERRORS.items()
                                                      for argv in errors] + [argv for argv, _ in NAME_ERRORS]
    named = {tuple(argv): f"layerpipe: error: {message}\n" for argv, message in NAME_ERRORS}
    assert set(PARSE_ERRORS) == set(COMMANDS)
    probe = (
        "import contextlib, io, json, sys\n"
        "from layerpipe.cli import main\n"
        "results = []\n"
        f"for argv in {cases!r}:\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            code = main(argv)\n"
        "        except SystemExit as exit_:\n"
        "            code = exit_.code\n"
        "    results.append([argv, code, err.getvalue()])\n"
        "print(json.dumps({'results': results, 'modules': sorted(sys.modules)}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True,
                          cwd=tmp_path)
    doc = json.loads(proc.stdout)
    for argv, code, err in doc["results"]:
        if argv[1:] == ["--help"]:
            assert (code, err) == (0, ""), argv
        elif tuple(argv) in named:  # a handler's InputError, before it imports the registries
            assert (code, err) == (2, named[tuple(argv)]), argv
        else:  # argparse's error names the subcommand's prog (a handler's InputError would not)
            assert code == 2 and err.count("\n") == 1, (argv, err)
            assert err.startswith(("layerpipe: error: layerpipe ", "layerpipe: error: layerpipe: ")), (argv, err)
    assert not list(tmp_path.iterdir())
    assert not [m for m in doc["modules"] if m.startswith(HEAVY_FOR_SUBCOMMANDS)]


def test_listed_help_lines_are_the_modules_own() -> None:
    """`COMMANDS` repeats each module's `help=` so the top-level parser needs no import; they must not drift."""
    import argparse
    import importlib

    for name, line in COMMANDS.items():
        action = argparse.ArgumentParser(prog="layerpipe").add_subparsers()
        importlib.import_module(f"layerpipe.commands.{name}").register(action)
        assert [(a.dest, a.help) for a in action._choices_actions] == [(name, line)]


@pytest.mark.parametrize("command", COMMAND_MODULES)
def test_subcommand_help_is_its_real_parser(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: layerpipe {command} ") and "options:" in out


def test_highs_chatter_does_not_reach_stdout(capfd) -> None:
    """HiGHS prints some messages with C printf (seen: "HighsMipSolverData::transformNewIntegerFeasibleSolution
    tmpSolver.run();" on residual_mlp, 3 processors, --no-intra), which corrupted `--format json` on stdout.
    The solve runs with file descriptor 1 pointed at /dev/null; Python's own output before and after stays."""
    from layerpipe.schedule._optimal import _stdout_silenced

    print("before", flush=True)
    with _stdout_silenced():
        os.write(1, b"C-level chatter\n")
    print("after", flush=True)
    assert capfd.readouterr().out == "before\nafter\n"
