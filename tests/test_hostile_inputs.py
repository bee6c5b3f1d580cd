"""Hostile inputs to every subcommand (issue 12, Done when): a table of special files, encodings, bombs,
limits, paths and conflicts. Each row must exit 2 with exactly one line on stderr (no traceback), nothing on
stdout, no file changed or left behind (inputs, outputs, temporaries), in under 10 s and 2 GB.

Rows run in-process through `layerpipe.cli.main` for speed (the memory check is the process's peak RSS, which
only grows, so a row that allocated gigabytes fails it and every later row); a sample of rows also runs in a
subprocess under a 2 GB address-space limit and a 10 s timeout, as a user sees it.

The hostile files are generated classes, not single examples: every network-taking command is driven with
every hostile file, so a new command or a new reader gets the whole class.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from layerpipe.cli import main

GOOD_NET = "version: 1\nname: tiny\ninput_shape: [4]\nlayers:\n  - {name: fc1, type: linear, out_features: 3}\n" \
           "  - {name: fc2, type: linear, out_features: 2}\n"


def _alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\nversion: 1\n"


#: Hostile text inputs by name: bytes, or None for the special files made by the fixture.
HOSTILE_FILES: dict[str, bytes | None] = {
    "bomb.yaml": _alias_bomb().encode(),
    "bomb_in_name.yaml": (_alias_bomb().replace("version: 1\n", "") +
                          "version: 1\nname: *a9\ninput_shape: [4]\nlayers: *a9\n").encode(),
    "deep.yaml": b"[" * 5000 + b"]" * 5000,
    "deepmap.yaml": b"a: " + b"{b: " * 3000 + b"1" + b"}" * 3000 + b"\n",
    "recursive.yaml": b"a: &a [*a]\n",
    "nul.yaml": GOOD_NET.replace("tiny", "ti\0ny").encode(),
    "bell.yaml": GOOD_NET.replace("tiny", "ti\x07ny").encode(),
    "esc.yaml": b"version: 1\nname: \x1b[2J\ninput_shape: [4]\n",
    "latin1.yaml": GOOD_NET.replace("tiny", "caf\u00e9").encode("latin-1"),
    "utf16.yaml": GOOD_NET.encode("utf-16"),
    "binary.yaml": bytes(range(256)) * 8,
    "empty.yaml": b"",
    "comment.yaml": b"# nothing here\n",
    "scalar.yaml": b"42\n",
    "list.yaml": b"- 1\n- 2\n",
    "multidoc.yaml": GOOD_NET.encode() + b"---\n" + GOOD_NET.encode(),
    "pytag.yaml": b"version: !!python/object/apply:os.system ['true']\n",
    "mapkey.yaml": b"? {a: 1}\n: 2\nversion: 1\n",
    "syntax.yaml": b"version: 1\n  name: [unclosed\n",
    "longkey.yaml": (GOOD_NET + "x" * 1_000_000 + ": 1\n").encode(),
    "hugewidth.yaml": GOOD_NET.replace("out_features: 2", "out_features: 99999999999999999999999").replace(
        "input_shape: [4]", "input_shape: [0]").encode(),
    "dup.yaml": GOOD_NET.replace("name: tiny\n", "name: tiny\nname: tiny2\n").encode(),
    "huge.yaml": None,  # sparse 3 GiB
    "fifo.yaml": None,
    "socket.yaml": None,
    "dir.yaml": None,
    "dangling.yaml": None,
    "loop.yaml": None,
    "devzero": None,  # a symlink to /dev/zero
}

#: Each network-taking command, with its other arguments ({net} the network, {w} the work folder).
NETWORK_COMMANDS: dict[str, list[str]] = {
    "graph": ["graph", "{net}", "-o", "{w}/out.txt"],
    "delays": ["delays", "{net}", "--stages", "even:1", "-o", "{w}/out.txt"],
    "schedule": ["schedule", "{net}", "--policy", "layerpipe", "-n", "2", "-o", "{w}/out.txt"],
    "compare": ["compare", "{net}", "-n", "2", "-o", "{w}/out.txt"],
    "simulate": ["simulate", "{net}", "--policy", "layerpipe", "-n", "2", "--out", "{w}/sim"],
    "explore": ["explore", "{net}", "-n", "2", "--out", "{w}/r.csv", "--no-progress"],
    "rtl": ["rtl", "{net}", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--out", "{w}/rtl", "--no-synth"],
    "verify": ["verify", "{net}", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--samples", "2"],
    "profile": ["profile", "{net}", "-o", "{w}/p.json"],
}

#: Hostile files driven through every network-taking command (one of each kind: bomb, depth, encoding,
#: special file, size).
FULL_CROSS = ("bomb_in_name.yaml", "deep.yaml", "latin1.yaml", "nul.yaml", "fifo.yaml", "huge.yaml", "devzero",
              "dir.yaml")

SCHEDULE_FILES: dict[str, str] = {
    "empty.txt": "",
    "forward_only.txt": "p0: F1.0 F2.0\n",
    "no_update.txt": "p0: F1.0 F2.0 A2.0 E2.0 G2.0 A1.0 G1.0 U2.0\n",
    "bad_op.txt": "p0: X9.0\n",
    "far_layer.txt": "p0: F100000000.0\n",
    "far_iteration.txt": "p0: F1.100000000\n",
    "negative.txt": "p0: F1.-3\n",
    "bad.csv": "F1.0,Q\n",
    "torch_far.csv": "0F100000000\n",
}

PROFILES: dict[str, bytes] = {
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "notjson.json": b"{version: 1",
    "nan.json": b'{"version": 1, "network": "mlp:4-3-2", "batch": 1, "layers": {"fc1": {"F": NaN}}}',
    "latin1.json": '{"version": 1, "network": "caf\u00e9"}'.encode("latin-1"),
    "list.json": b"[1, 2]",
    "huge_int.json": b'{"version": 1, "network": "mlp:4-3-2", "batch": 99999999999999999999999999, "layers": {}}',
}

SWEEPS: dict[str, bytes] = {
    "sweep_many.yaml": b"version: 1\nnetworks: [mlp:4-3-2, lenet5]\nnum_procs: [" +
                       ",".join(str(i) for i in range(1, 4097)).encode() + b"]\npolicies: [layerpipe, pipedream]\n"
                       b"lanes: [" + ",".join(str(i) for i in range(1, 65)).encode() + b"]\n",
    "sweep_bool.yaml": b"version: 1\nnetworks: [mlp:4-3-2]\nnum_procs: [true]\npolicies: [layerpipe]\n",
    "sweep_str.yaml": b"version: 1\nnetworks: mlp:4-3-2\nnum_procs: ['2']\npolicies: [layerpipe]\n",
    "sweep_neg.yaml": b"version: 1\nnetworks: [mlp:4-3-2]\nnum_procs: [-2]\npolicies: [layerpipe]\n",
}


def _make_special(root: Path, name: str) -> None:
    path = root / name
    if name == "huge.yaml":
        with open(path, "wb") as fh:
            fh.truncate(3 << 30)  # sparse: no disk used, 3 GiB to a reader
    elif name == "fifo.yaml":
        os.mkfifo(path)
    elif name == "socket.yaml":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif name == "dir.yaml":
        path.mkdir()
    elif name == "dangling.yaml":
        path.symlink_to(root / "no_such_target.yaml")
    elif name == "loop.yaml":
        path.symlink_to(path)
    elif name == "devzero":
        path.symlink_to("/dev/zero")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    for name, data in HOSTILE_FILES.items():
        if data is None:
            _make_special(root, name)
        else:
            (root / name).write_bytes(data)
    for name, text in SCHEDULE_FILES.items():
        (root / name).write_text(text)
    for name, data in {**PROFILES, **SWEEPS}.items():
        (root / name).write_bytes(data)
    (root / "good.yaml").write_text(GOOD_NET)
    (root / "notes.txt").write_text("the user's notes\n")
    (root / "notresults.csv").write_text("a,b\n1,2\n")
    for folder in ("sim_foreign", "rtl_foreign", "report_foreign"):
        (root / folder).mkdir()
        (root / folder / "precious.txt").write_text("keep me\n")
    (root / "sim_mixed").mkdir()  # an earlier simulate run plus a file of the user's
    (root / "sim_mixed" / "metrics.json").write_text("{}")
    (root / "sim_mixed" / "mine.txt").write_text("keep me\n")
    (root / "pareto_user").mkdir()
    (root / "pareto_user" / "pareto.svg").write_bytes(b"the user's picture")
    return root


def _snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under `root` (links not followed): kind, size, mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = "l" if os.path.islink(path) else "d" if os.path.isdir(path) else "f"
            out[os.path.relpath(path, root)] = (kind, st.st_size if kind == "f" else 0, st.st_mtime_ns)
    return out


def _rows() -> Iterator[tuple[str, list[str], list[str]]]:
    """(id, argv with {i} inputs and {w} work folder, words the error line must contain)."""
    for name in HOSTILE_FILES:
        # every command reads its NETWORK through one loader: the whole cross for a few files of each kind,
        # three commands (no output, a file output, a folder output) for the rest, to keep the table fast
        commands = NETWORK_COMMANDS if name in FULL_CROSS else ("graph", "simulate", "explore")
        for command in commands:
            argv = NETWORK_COMMANDS[command]
            yield f"{command}-{name}", [a.replace("{net}", "{i}/" + name) for a in argv], []
    # schedule files, profiles, sweeps: every hostile text file in each reader too
    sim_sched = ["simulate", "{i}/good.yaml", "--schedule", "{f}", "--out", "{w}/sim"]
    for name in [*SCHEDULE_FILES, "nul.yaml", "latin1.yaml", "fifo.yaml", "huge.yaml", "dir.yaml", "devzero",
                 "binary.yaml", "socket.yaml"]:
        yield f"schedule-file-{name}", [a.replace("{f}", "{i}/" + name) for a in sim_sched], []
    yield "stage-schedule-torch-far", ["simulate", "--schedule", "{i}/torch_far.csv", "--schedule-format",
                                       "torch-csv", "--stage-costs", "1,1,0", "--out", "{w}/sim"], ["limit"]
    for name in [*PROFILES, "fifo.yaml", "huge.yaml", "nul.yaml", "devzero"]:
        yield f"profile-file-{name}", ["graph", "mlp:4-3-2", "--cost-model", "profiled", "--profile", "{i}/" + name],\
            []
    for name in [*SWEEPS, "bomb.yaml", "deep.yaml", "recursive.yaml", "latin1.yaml", "fifo.yaml", "huge.yaml",
                 "nul.yaml", "devzero", "empty.yaml"]:
        yield f"sweep-file-{name}", ["explore", "--sweep", "{i}/" + name, "--out", "{w}/r.csv", "--no-progress"], []
    yield from _limit_rows()
    yield from _path_rows()
    yield from _conflict_rows()


def _limit_rows() -> Iterator[tuple[str, list[str], list[str]]]:
    for index, row in enumerate(_limit_rows_unnumbered()):
        yield f"{row[0]}-{index}", row[1], row[2]


def _limit_rows_unnumbered() -> Iterator[tuple[str, list[str], list[str]]]:
    sim = ["simulate", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--out", "{w}/sim"]
    big = "99999999999999999999"
    for flag, value, word in [("--samples", big, "--samples"), ("--samples", "6400000", "limit"),
                              ("--samples", "0", "--samples"), ("--batch", big, "--batch"),
                              ("--lanes", big, "--lanes"), ("--overhead", big, "--overhead"),
                              ("--seed", "-1", "--seed"), ("--lr", "abc", "--lr"), ("--lr", "nan", "--lr"),
                              ("--lr", "-1", "--lr"), ("--mode", "fresh", "--mode")]:
        yield f"limit-simulate{flag}={value[:8]}", [*sim, flag, value], [word]
    yield "limit-simulate-functional-size", ["simulate", "mlp:4096-4096-4096", "--policy", "layerpipe", "-n", "2",
                                             "--samples", "20000", "--functional", "float64", "--out", "{w}/sim"],\
        ["--functional", "limit"]
    yield "limit-simulate-total-bits", [*sim, "--functional", "fixed", "--total-bits", big], ["bits"]
    yield "limit-simulate-procs", [*sim[:4], "-n", big, *sim[6:]], ["-n"]
    for argv, word in [
        (["schedule", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--format", "csv", "--iterations", big],
         "--iterations"),
        (["schedule", "--policy", "gpipe", "--stages", "4", "--microbatches", big, "--stage-costs", "1,1,0"],
         "micro"),
        (["schedule", "mlp:4-3-2", "--policy", "layerpipe", "-n", "4097"], "-n"),
        (["delays", "lenet5", "--stages", "0,0,0,0,0,0,0," + big], "--stages"),
        (["delays", "lenet5", "--stages", "0,0,0,0,0,0,0,-1"], "--stages"),
        (["delays", "lenet5", "--stages", "even:" + big], "--stages"),
        (["compare", "mlp:4-3-2", "-n", "1-" + big], "-n"),
        (["compare", "mlp:4-3-2", "-n", "9-2"], "LO <= HI"),
        (["compare", "mlp:4-3-2", "-n", "2", "--lr", "1"], "unrecognized"),
        (["explore", "mlp:4-3-2", "-n", "2", "--jobs", "100000", "--out", "{w}/r.csv"], "--jobs"),
        (["explore", "mlp:4-3-2", "-n", "1-4096", "--lanes", "1-64", "--policies", "layerpipe,pipedream,ooo",
          "--out", "{w}/r.csv", "--no-progress"], "limit"),
        (["rtl", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--samples", big, "--out",
          "{w}/rtl", "--no-synth"], "samples"),
        (["rtl", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", big, "--out", "{w}/rtl"], "lanes"),
        (["rtl", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--lr-shift", big, "--out",
          "{w}/rtl", "--no-synth"], "shift"),
        (["verify", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--samples", "2", "--seed",
          "-5"], "--seed"),
        (["verify", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--samples", "2", "--stall",
          "nan"], "--stall"),
        (["profile", "mlp:4-3-2", "--repeats", big], "--repeats"),
        (["profile", "mlp:4-3-2", "--seed", "-1"], "--seed"),
        (["graph", "mlp:" + "-".join(["4"] * 3) + "-0"], "mlp"),
        (["graph", "mlp:4-3-2", "--batch", "0"], "--batch"),
    ]:
        yield f"limit-{argv[0]}-{word}-{'_'.join(argv[-3:])[:30]}", argv, [word]


def _path_rows() -> Iterator[tuple[str, list[str], list[str]]]:
    sched = ["schedule", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "-o"]
    for target, word in [("{i}", "directory"), ("{i}/socket.yaml", "special"), ("{i}/fifo.yaml", "no reader"),
                         ("/proc/no/such/x", "cannot write"), ("/dev/full", "No space"), ("", "file path"),
                         ("{i}/notes.txt/x", "cannot write"), ("/proc/version", "cannot write")]:
        yield f"path-o-{target[-14:]}", [*sched, target], [word]
    sim = ["simulate", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--out"]
    rtl = ["rtl", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--no-synth", "--out"]
    report = ["report", "--no-rtl", "--no-progress", "--out"]
    for name, prefix in (("simulate", sim), ("rtl", rtl), ("report", report)):
        for target, word in [("/", "current folder"), (".", "current folder"), ("..", "current folder"),
                             ("", "folder path"), ("{i}/notes.txt", "the file"),
                             (f"{{i}}/{name[:3] if name != 'report' else 'report'}_foreign", "holds"),
                             ("{i}", "holds")]:
            yield f"path-{name}-out-{target[-14:] or 'empty'}", [*prefix, target], [word]
    yield "path-simulate-out-mixed", [*sim, "{i}/sim_mixed"], ["mine.txt"]
    yield "path-simulate-out-proc", [*sim, "/proc/layerpipe_out"], []
    yield "path-rtl-out-proc", [*rtl, "/proc/layerpipe_out"], []
    explore = ["explore", "mlp:4-3-2", "-n", "2", "--no-progress", "--out"]
    yield "path-explore-not-results", [*explore, "{i}/notresults.csv"], ["not a layerpipe results file"]
    yield "path-explore-resume-not-results", [*explore, "{i}/notresults.csv", "--resume"], ["not a layerpipe"]
    yield "path-explore-latin1-results", [*explore, "{i}/latin1.yaml"], []
    yield "path-explore-fifo-results", [*explore, "{i}/fifo.yaml"], []
    yield "path-explore-pareto-user", [*explore, "{w}/r.csv", "--pareto-dir", "{i}/pareto_user"], ["pareto.svg"]
    yield "path-explore-out-dir", [*explore, "{i}"], ["directory"]
    verify = ["verify", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--samples", "2",
              "--build-dir"]
    yield "path-verify-build-file", [*verify, "{i}/notes.txt"], ["folder"]
    yield "path-verify-build-proc", [*verify, "/proc/layerpipe_build"], ["cannot create"]
    yield "path-verify-build-empty", [*verify, ""], ["folder"]
    yield "path-profile-o-dir", ["profile", "mlp:4-3-2", "-o", "{i}"], ["directory"]
    yield "path-network-missing", ["graph", "{i}/missing.yaml"], ["No such file"]


def _conflict_rows() -> Iterator[tuple[str, list[str], list[str]]]:
    for argv, word in [
        (["simulate", "mlp:4-3-2", "--policy", "layerpipe", "--schedule", "{i}/empty.txt", "--out", "{w}/sim"],
         "not allowed"),
        (["simulate", "mlp:4-3-2", "--policy", "layerpipe", "--out", "{w}/sim"], "-n"),
        (["simulate", "--policy", "layerpipe", "-n", "2", "--out", "{w}/sim"], "NETWORK"),
        (["simulate", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--stage-costs", "1,1,0", "--out", "{w}/sim"],
         "--stage-costs"),
        (["simulate", "mlp:4-3-2", "--schedule", "{i}/forward_only.txt", "-n", "2", "--out", "{w}/sim"], "-n"),
        (["simulate", "--schedule", "{i}/forward_only.txt", "--out", "{w}/sim"], "NETWORK"),
        (["explore", "--sweep", "{i}/sweep_bool.yaml", "mlp:4-3-2", "--out", "{w}/r.csv"], "either"),
        (["explore", "mlp:4-3-2", "--out", "{w}/r.csv"], "-n"),
        (["graph", "mlp:4-3-2", "--cost-model", "macs", "--lanes", "4"], "--lanes"),
        (["graph", "mlp:4-3-2", "--cost-model", "profiled"], "profile"),
        (["schedule", "mlp:4-3-2", "--policy", "pipedream", "-n", "2", "--max-staleness", "1"], "--max-staleness"),
        (["compare", "mlp:4-3-2", "-n", "2", "--policies", ",,"], "--policies"),
        (["compare", "mlp:4-3-2", "-n", "2", "--baseline", "nope"], "unknown policy 'nope'"),
        (["rtl", "resnet18", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--out", "{w}/rtl"], "not a chain"),
        (["rtl", "mlp:4-3-2", "--policy", "gpipe", "-n", "2", "--lanes", "4", "--out", "{w}/rtl"], "gpipe"),
        (["nosuchcommand"], "invalid choice"),
        ([], "COMMAND"),
    ]:
        yield f"conflict-{len(argv)}-{'_'.join(argv)[:40]}", argv, [word]


ROWS = list(_rows())
#: Rows also run as a user runs them: a subprocess, 2 GB of address space, 10 s.
SUBPROCESS_ROWS = {"graph-bomb_in_name.yaml", "simulate-huge.yaml", "explore-fifo.yaml", "graph-deep.yaml",
                   "path-o-/dev/full", "schedule-file-far_iteration.txt", "delays-devzero", "graph-bomb.yaml"}
LIMIT_BYTES = 2 << 30
LIMIT_SECONDS = 10.0


def test_the_table_is_large_and_covers_every_command() -> None:
    from layerpipe.cli import COMMAND_MODULES

    assert len(ROWS) >= 150
    assert len({row_id for row_id, _, _ in ROWS}) == len(ROWS)
    used = {argv[0] for _, argv, _ in ROWS if argv}
    assert set(COMMAND_MODULES) <= used, set(COMMAND_MODULES) - used
    assert {row_id for row_id, _, _ in ROWS} >= SUBPROCESS_ROWS


def _argv(argv: list[str], inputs: Path, work: Path) -> list[str]:
    return [a.replace("{i}", str(inputs)).replace("{w}", str(work)) for a in argv]


@pytest.mark.parametrize(("row_id", "argv", "words"), ROWS, ids=[r[0] for r in ROWS])
def test_hostile_input_is_one_line_exit_2_and_changes_nothing(row_id: str, argv: list[str], words: list[str],
                                                              inputs: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = _snapshot(inputs)
    t0 = time.perf_counter()
    code = main(_argv(argv, inputs, work))
    seconds = time.perf_counter() - t0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2, (code, captured.err[-2000:])
    assert captured.out == ""
    assert len(lines) == 1 and lines[0].startswith("layerpipe: error: "), captured.err[-2000:]
    assert "Traceback" not in captured.err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert seconds < LIMIT_SECONDS, seconds
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert peak < LIMIT_BYTES, f"peak RSS {peak / 2**30:.2f} GiB"
    assert _snapshot(inputs) == before, "an input or a foreign file was changed"
    assert sorted(os.listdir(work)) == [], f"left behind: {os.listdir(work)}"
    assert not Path("/proc/layerpipe_out").exists()


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


@pytest.mark.slow  # ~1 s each: a Python start per row
@pytest.mark.parametrize(("row_id", "argv", "words"), [r for r in ROWS if r[0] in SUBPROCESS_ROWS],
                         ids=[r[0] for r in ROWS if r[0] in SUBPROCESS_ROWS])
def test_hostile_input_in_a_subprocess(row_id: str, argv: list[str], words: list[str], inputs: Path,
                                       tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    before = _snapshot(inputs)
    proc = subprocess.run([sys.executable, "-m", "layerpipe.cli", *_argv(argv, inputs, work)], cwd=work,
                          capture_output=True, text=True, timeout=LIMIT_SECONDS * 3, preexec_fn=_limited,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert _snapshot(inputs) == before and os.listdir(work) == []


def test_output_follows_a_symlink_and_writes_devices_in_place(tmp_path: Path, capsys) -> None:
    """Issue 12 item 3: -o keeps a symlink a link (its target gets the content), writes /dev/null and a FIFO with
    a reader in place (they stay what they are), and a dangling link creates its target."""
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    sched = ["schedule", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "-o"]
    assert main([*sched, str(link)]) == 0
    assert link.is_symlink() and target.read_text() != "old" and "p0" in target.read_text()
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "created.txt")
    assert main([*sched, str(dangling)]) == 0
    assert dangling.is_symlink() and (tmp_path / "created.txt").is_file()
    assert main([*sched, "/dev/null"]) == 0
    assert Path("/dev/null").is_char_device()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    time.sleep(0.2)  # the reader opens the FIFO first
    assert main([*sched, str(fifo)]) == 0
    out, _ = reader.communicate(timeout=10)
    assert b"p0" in out and fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["created.txt", "dangling.txt", "fifo", "link.txt",
                                                          "real.txt"]
    capsys.readouterr()


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    out.write_text("old")
    out.chmod(0o640)
    assert main(["schedule", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "-o", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o640


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    """Issue 12 item 9: rtl, verify, report without the hdl/torch extras: one line naming pip install, exit 2,
    checked before any work (the module is hidden by a None entry in sys.modules, as if not installed)."""
    monkeypatch.setitem(sys.modules, "amaranth", None)
    monkeypatch.chdir(tmp_path)
    for argv in (["rtl", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--out", "o"],
                 ["verify", "mlp:4-3-2", "--policy", "layerpipe", "-n", "2", "--lanes", "4", "--samples", "2"],
                 ["report", "--out", "r", "--no-progress"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pip install 'layerpipe[hdl]'" in err, err
    assert os.listdir(tmp_path) == []
    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["profile", "mlp:4-3-2"]) == 2
    assert "pip install 'layerpipe[torch]'" in capsys.readouterr().err
