"""The microcode-level model: the compiled `Program` executed in Python, op by op (the FL/CL rung between
the integer reference and the RTL, like pymtl3's ladder).

It runs what the hardware runs — each PE's entries with their steps' operands (buffer, slot), weight versions
(ring slots), transfers (source slot → destination slot) — with `layerpipe.fixedpoint`'s arithmetic, in the
simulator's timing order: ops by start cycle, a transfer's data written at its producer's end (the earliest
the hardware's arrival can be). So a compiler fault (a wrong address, version, ring depth, a transfer to the
wrong slot) shows up as wrong values here, in pure Python, before any RTL runs. It keeps every op's output
(`ModelRun.outputs`, per-op values) and the final weights, which must equal the integer reference's.

Simplification: memories hold values per buffer slot (element arrays), not packed words; the packing is the
PE's, checked by its unit benches. Conv2d, pooling and flatten steps run their window engine's loop nest
(`hdl/_conv.run_window`) on the slots' element arrays; conv weights are their (O, C·K·K) matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layerpipe.hdl._program import Buffer, Entry, PEProgram, Program, Step

__all__ = ["ModelRun", "run_program"]


@dataclass
class ModelRun:
    """Final weights `W{l}` (int64 arrays) and every op's output: (pe, kind, layer, t) → array."""

    weights: dict[str, np.ndarray]
    outputs: dict[tuple[int, str, int, int], np.ndarray] = field(default_factory=dict)


class _Memory:
    """One PE's buffers: slot index → array (a slot of a vector buffer holds B vectors; of W, one matrix).

    A view (a split layer's part inside the concatenation its consumer reads, `hdl/_split.py`) is the slice of
    its region's slot at its word offset: elements offset·lanes … + n; the region starts as zeros (the parts'
    padding)."""

    def __init__(self, pe: PEProgram, lanes: int = 1, widths: tuple[int, ...] = (), batch: int = 1) -> None:
        self.pe = pe
        self.batch = batch
        self.lanes = lanes
        self.widths = widths  #: a view of part a<i> / e<i> holds widths[i] elements
        self.slots: dict[tuple[str, int], np.ndarray] = {}

    def _view(self, buf: Buffer, index: int) -> tuple[np.ndarray, slice]:
        region = self.pe.buffer(buf.view_of)
        key = (region.name, index % region.depth)
        if key not in self.slots:
            # B samples, each with all the parts side by side (`hdl/_split.py`)
            self.slots[key] = np.zeros((self.batch, region.slot_words // self.batch * self.lanes), dtype=np.int64)
        start = (buf.base - region.base) * self.lanes
        return self.slots[key], slice(start, start + buf.slot_words // self.batch * self.lanes)

    def read(self, name: str, index: int) -> np.ndarray:
        buf = self.pe.buffer(name)
        if buf.view_of:
            array, part = self._view(buf, index)
            return array[..., part][..., :self.widths[int(name.split("@")[0][1:])]].copy()
        key = (name, index % buf.depth)
        if key not in self.slots:
            raise AssertionError(f"PE {self.pe.index} reads {name} slot {index % buf.depth} before anything wrote it")
        return self.slots[key]

    def write(self, name: str, index: int, value: np.ndarray) -> None:
        buf: Buffer = self.pe.buffer(name)
        if buf.view_of:
            array, part = self._view(buf, index)
            value = np.asarray(value, dtype=np.int64)
            array[..., part.start:part.start + value.shape[-1]] = value
            return
        self.slots[(name, index % buf.depth)] = np.array(value, dtype=np.int64)


def run_program(program: Program, design: Any, vectors: dict[str, Any]) -> ModelRun:
    """Execute `program` for `design.samples` iterations on the inputs of `vectors` (`Design.vectors`)."""
    fmt, batch, samples = program.fmt, program.network.batch, design.samples
    memories = [_Memory(pe, program.lanes, program.widths, batch) for pe in program.pes]
    x = np.asarray(vectors["x"], dtype=np.int64).reshape(samples, batch, -1)
    y = np.asarray(vectors["y"], dtype=np.int64).reshape(samples, batch, -1)
    # The sample rings hold `depth` iterations: the host fills them before the run and writes x(t + depth),
    # y(t + depth) once the entry holding G_1(t) has ended (hdl/_top.py's release rule).
    rings = [(p, b) for p, pe in enumerate(program.pes) for b in pe.buffers if b.memory == "samples"]

    def deliver(t: int) -> None:
        for p, b in rings:
            memories[p].write(b.name, t, x[t] if b.name == "x" else y[t])

    depth = min(b.depth for _, b in rings)
    for t in range(min(samples, depth)):
        deliver(t)
    for layer in vectors["layers"]:
        init = np.asarray(layer["init"], dtype=np.int64)
        memories[layer["pe"]].write(f"W{layer['layer']}", 0, init)
        for pe, _ in layer["copies"]:
            memories[pe].write(f"C{layer['layer']}", 0, init)

    entry_of = {(pe.index, e.kind, e.layer): e for pe in program.pes for e in pe.entries}
    sim = design.sim
    events = []  # (time, order, kind, op): computes at their start, transfers at their producer's end
    for k, (op, start, end) in enumerate(zip(sim.ops, sim.start, sim.end, strict=True)):
        events.append((int(start), 1, k, "run", op))
        events.append((int(end), 0, k, "send", op))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    run = ModelRun({})
    for _, _, _, what, op in events:
        entry = entry_of[(op.proc, op.kind, op.unit)]
        t = op.iteration
        if what == "run":
            for step in entry.steps:
                out = _step(step, memories[op.proc], t, fmt, design.lr_shift)
                run.outputs[(op.proc, step.kind, step.layer, t)] = out
        else:
            _send(entry, op.proc, t, samples, memories)
            if any(step.kind == "G" and step.layer == 1 for step in entry.steps) and t + depth < samples:
                deliver(t + depth)
    for layer in vectors["layers"]:
        run.weights[f"W{layer['layer']}"] = memories[layer["pe"]].read(f"W{layer['layer']}", samples)
    return run


def _send(entry: Entry, src: int, t: int, samples: int, memories: list[_Memory]) -> None:
    for s in entry.sends:
        if t + s.delay < samples:
            value = memories[src].read(s.src, max(0, t + s.src_offset))
            memories[s.dest].write(s.dst, t + s.dst_offset, value)


def _step(step: Step, mem: _Memory, t: int, fmt: Any, lr_shift: int) -> np.ndarray:
    """One PE command on the model's memories; returns what it wrote."""
    def version(offset: int) -> int:
        return max(0, t + offset)

    if step.window is not None:
        return _window(step, mem, t, fmt, version(step.version))
    if step.kind == "F":
        z = fmt.matvec(mem.read(step.w, version(step.version)), mem.read(step.x, t))
        out = fmt.relu(z) if step.relu else z
    elif step.kind == "A":
        if step.relu:  # δ = e ⊙ (a > 0): a = relu(z), so the mask of a is the mask of z
            e = mem.read(step.x, t)
            if step.x_sum:  # a split layer's partial errors: summed exactly, saturated once
                e = fmt.saturate(sum((mem.read(name, t) for name in step.x_sum), e))
            out = e * fmt.relu_grad_mask(mem.read(step.y, t))
        else:
            out = fmt.output_error(mem.read(step.x, t), mem.read(step.y, t))
    elif step.kind == "E":
        w = mem.read(step.w, version(step.version))
        out = fmt.matmul(mem.read(step.y, t), w)
    elif step.kind == "G":
        out = fmt.outer_gradient(mem.read(step.y, t), mem.read(step.x, t))
    else:  # U: reads version t, writes t + 1
        out = fmt.sgd_update(mem.read(step.w, t), mem.read(step.g, t), lr_shift)
        mem.write(step.dst, t + 1, out)
        return out
    mem.write(step.dst, t, out)
    return out


def _window(step: Step, mem: _Memory, t: int, fmt: Any, version: int) -> np.ndarray:
    """A conv2d / pooling step (the window engine's loop nest) or a flatten copy; returns its main output."""
    from layerpipe.hdl._conv import run_window

    window = step.window
    assert window is not None
    if window.op == "copy":
        out = mem.read(step.x, t)
    else:
        operands: tuple[np.ndarray, np.ndarray | None]
        if window.op in ("conv_f", "conv_e"):
            operands = (mem.read(step.x if window.op == "conv_f" else step.y, t), mem.read(step.w, version))
        elif window.op == "conv_g":
            operands = (mem.read(step.y, t), mem.read(step.x, t))
        else:
            operands = (mem.read(step.x, t), mem.read(step.y, t) if step.y else None)
        out, mask = run_window(window, fmt, *operands)
        if step.mask:
            assert mask is not None
            mem.write(step.mask, t, mask)
    mem.write(step.dst, t, out)
    return out
