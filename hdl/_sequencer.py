"""The sequencer of one PE: walks the microcode ROM period by period and issues PE commands, self-timed.

The ROM is the PE's compiled body (`PEProgram`) flattened into rows, one per atomic step; the steps of a
fused task (PipeDream's AEG) are consecutive rows of one entry. The sequencer holds the next row to run as
(period j, row): row r runs iteration t = j − lag_r, and rows whose iteration is < 0 or ≥ T are skipped —
in zero cycles, because the next row is found ahead: for every row the earliest period ≥ the current one in
which its iteration is in range is max(j', lag) (valid while < T + lag), and the next row is the smallest
(period, row) pair after the current one. That search (and the row's command) runs in registered stages
behind the current row while its op runs (an op takes longer than they do), so the issue itself only
compares arrival counters with registered thresholds. So an op starts exactly when its PE is free and its
inputs have arrived, as the simulator assumes:

- a row is issued (`cmd.valid`) when it is the head of its entry and every arrival counter it waits on
  exceeds t − delay (the counters count transfers received, in iteration order; a weight copy sent by
  U_l(t − s − 1) to F_l(t) waits with delay s + 1), or when it continues an entry;
- the PE accepts it in that cycle if it is idle (`cmd.ready`);
- when the entry's last step ends (the PE's `done`), (entry, t) is pushed to the link senders;
- an entry that reads a sample (x or y from the PE's sample ring) also waits until the host's stream has
  delivered it (`x_loaded` / `y_loaded` > t: iterations loaded so far); while the host keeps the ring full
  that wait is always met, so the timing is the simulator's.

Addresses are computed from t with constant strides per row: vector slot t mod depth, weight version
max(0, t + c) mod ring (U: reads version t, writes t + 1), gradient slot t mod depth.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from layerpipe.hdl._datapath import Opcode, iteration_sum_shape, mul_const
from layerpipe.hdl._pe import PEConfig, command_layout, op_overhead
from layerpipe.hdl._program import Buffer, PEProgram, Step

__all__ = ["Row", "Sequencer", "rows_of"]

_OPCODES = {("F", True): Opcode.FWD_RELU, ("F", False): Opcode.FWD_LINEAR, ("A", True): Opcode.ACT_RELU,
            ("A", False): Opcode.OUT_ERR}


@dataclass(frozen=True)
class Row:
    """One ROM row: an atomic step of entry `entry` (head: its first step; tail: its last)."""

    entry: int
    lag: int
    head: bool
    tail: bool
    waits: tuple[tuple[int, int], ...]  #: (counter, delay)
    step: Step


def rows_of(pe: PEProgram) -> list[Row]:
    rows = []
    for e_idx, e in enumerate(pe.entries):
        for k, step in enumerate(e.steps):
            rows.append(Row(e_idx, e.lag, k == 0, k == len(e.steps) - 1, e.waits if k == 0 else (), step))
    return rows


def _ring(index: Value, buffer: Buffer) -> Value | int:
    """Address of slot `index` mod depth (depth a power of two) of `buffer`: shifts and adds, no multiplier."""
    if buffer.depth == 1:
        return buffer.base
    return buffer.base + mul_const(index[: (buffer.depth - 1).bit_length()], buffer.pitch)


class Sequencer(wiring.Component):
    """Issues the PE's commands. `start` begins a run of `samples` iterations (held during the run)."""

    def __init__(self, pe: PEProgram, config: PEConfig, iteration_bits: int) -> None:
        self.pe = pe
        self.config = config
        self.rows = rows_of(pe)
        self.iteration_bits = iteration_bits
        self.period_bits = iteration_bits + 1 + max(1, pe.max_lag).bit_length()
        counters = max(1, len(pe.counters))
        super().__init__({
            "start": In(1),  # pulse: compute the first row (the run's cycle 0 is the next cycle)
            "samples": In(unsigned(iteration_bits)),
            "cmd": Out(stream.Signature(command_layout(config))),
            "pe_done": In(1),
            "arrived": In(1).array(counters),  # one pulse per received transfer, per counter
            # Iterations whose x / y the host has delivered into the sample rings (hdl/_host.py).
            "x_loaded": In(unsigned(iteration_bits + 1)),
            "y_loaded": In(unsigned(iteration_bits + 1)),
            "push_valid": Out(1),
            "push_entry": Out(range(max(2, len(pe.entries)))),
            "push_iter": Out(unsigned(iteration_bits)),
            "exhausted": Out(1),  # no row left to issue
            # Observation (a passive monitor's tap): an entry's first step issued this cycle, which, for which t.
            "trace_valid": Out(1),
            "trace_entry": Out(range(max(2, len(pe.entries)))),
            "trace_iter": Out(unsigned(iteration_bits)),
            "issued": Out(32),  # commands issued in this run
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        rows, n = self.rows, len(self.rows)
        ibits, pbits = self.iteration_bits, self.period_bits
        row_bits = max(1, (n - 1).bit_length())

        # The current row (period, pc) changes only after it issues, and two issues are at least one op apart
        # (the PE is busy from accept to its last write: > op_overhead cycles). So everything derived from it
        # — its successor, its iteration and command, its waits — is computed in registered stages behind it
        # (`settle_cycles`, then 2 for the command), and the issue decision itself is shallow: the arrival
        # counters against registered thresholds. On `start` the first row is a constant (the smallest
        # (lag, row) when T > 0), so its iteration and command stages are loaded with constants and cycle 0
        # can issue, as before.
        period = Signal(pbits)
        pc = Signal(range(max(2, n)))
        have = Signal()  # (period, pc) is a row to run
        started = Signal()
        first_row = min(range(n), key=lambda i: (rows[i].lag, i)) if rows else 0

        # ---- next row after (period, pc): per-row candidates (two registered stages), then a min tree -------
        j_next = period + 1
        period_r = Signal(pbits)  # stage A's copy of the period
        m.d.sync += period_r.eq(period)
        keys = []
        for i, row in enumerate(rows):
            lag = Const(row.lag, pbits)
            # Terms that are constant for this row are left out (Verilator's lint flags constant comparisons).
            after = (Const(i, row_bits + 1) > pc) if i > 0 else Const(0, 1)
            started_lag = (period >= lag) if row.lag > 0 else Const(1, 1)
            # Stage A: the row runs in this period (in_now), else the earliest later period it could (later).
            in_now = Signal(name=f"in_now{i}")
            later = Signal(pbits, name=f"later{i}")
            m.d.sync += [in_now.eq(after & started_lag & (period < self.samples + lag)),
                         later.eq(Mux(j_next > lag, j_next, lag))]
            # Stage B: whether that later period is still in range; the candidate's (period, row) key.
            ok_later = later < self.samples + lag
            key = Signal(pbits + row_bits, name=f"key{i}")
            valid = Signal(name=f"cand{i}")
            m.d.sync += [key.eq(Mux(in_now, period_r, later) << row_bits | i), valid.eq(in_now | ok_later)]
            keys.append((valid, key))
        next_valid, next_key = _min_tree(m, keys, levels_per_stage=self.tree_levels_per_stage)
        settle = self.settle_cycles
        shortest = op_overhead(self.config.lanes) + 1
        # An issued row is replaced at most max(1, `settle`) cycles later and its command is registered 2 cycles
        # after that: all before the PE, busy with the issued op for at least `shortest` cycles, takes the next.
        assert max(1, settle) + 2 < shortest, f"the next row settles in {settle} + 2 cycles, an op ends in {shortest}"

        # ---- arrival counters --------------------------------------------------------------------------
        counts = [Signal(ibits + 1, name=f"arrived{k}") for k in range(len(self.pe.counters))]
        for k, count in enumerate(counts):
            with m.If(self.arrived[k]):
                m.d.sync += count.eq(count + 1)

        # ---- the current row's iteration (stage 1), its command and waits (stage 2) ---------------------
        t = Signal(ibits)  # t = period − lag of the row (registered)
        pc_d = Signal.like(pc)
        with m.If(self.start):
            m.d.sync += [t.eq(0), pc_d.eq(first_row)]
        with m.Else():
            m.d.sync += [t.eq(period - self._lag_of(m, pc)), pc_d.eq(pc)]
        # Stage 2 reads stage 1, or on `start` the first row's constants (so they are valid in cycle 0).
        t_in = Signal(ibits)
        pc_in = Signal.like(pc)
        m.d.comb += [t_in.eq(Mux(self.start, 0, t)), pc_in.eq(Mux(self.start, first_row, pc_d))]
        head = Signal()
        tail = Signal()
        entry = Signal.like(self.push_entry)
        cmd = Signal(command_layout(self.config))
        # Per arrival counter of the PE: the current row waits on it (need) until it exceeds t − delay (thr).
        need = [Signal(name=f"need{k}") for k in range(len(counts))]
        deepest = max((delay for row in rows for _, delay in row.waits), default=0)
        thr = [Signal(iteration_sum_shape(ibits, -deepest, 0), name=f"thr{k}") for k in range(len(counts))]
        # The samples delivered (x, then y): the head of an entry that reads them waits until they exceed t.
        sample_waits = self._sample_waits()
        loaded = [(value, port) for value, port in (("x", self.x_loaded), ("y", self.y_loaded))
                  if any(value in names for names in sample_waits.values())]
        need_sample = [Signal(name=f"need_{value}") for value, _ in loaded]
        t_wait = Signal(ibits)
        cmd_next = Signal.like(cmd)
        with m.Switch(pc_in):
            for i, row in enumerate(rows):
                with m.Case(i):
                    m.d.sync += [head.eq(row.head), tail.eq(row.tail), entry.eq(row.entry)]
                    binding: dict[int, int] = {}  # two waits on one counter: the smaller delay binds
                    for k, delay in row.waits:
                        binding[k] = min(delay, binding.get(k, delay))
                    for (value, _), flag in zip(loaded, need_sample, strict=True):
                        m.d.sync += flag.eq(row.head and value in sample_waits[row.entry])
                    for k in range(len(counts)):
                        m.d.sync += need[k].eq(k in binding)
                        if k in binding:
                            m.d.sync += thr[k].eq(t_in - binding[k])
                    self._command(m, cmd_next, row.step, t_in)
        m.d.sync += cmd.eq(cmd_next)
        if loaded:
            m.d.sync += t_wait.eq(t_in)
        ready_in = Signal()
        waits = [~need[k] | (counts[k] > thr[k]) for k in range(len(counts))]
        waits += [~flag | (port > t_wait) for (_, port), flag in zip(loaded, need_sample, strict=True)]
        m.d.comb += ready_in.eq(_all(waits))
        issue = Signal()
        m.d.comb += [
            self.cmd.valid.eq(started & have & (~head | ready_in)),
            self.cmd.payload.eq(cmd),
            issue.eq(self.cmd.valid & self.cmd.ready),
            self.exhausted.eq(~have),
            self.trace_valid.eq(issue & head),
            self.trace_entry.eq(entry),
            self.trace_iter.eq(t),
        ]

        # The issued row stays current until its successor is registered (`stale` counts down the cycles
        # after a change of the row), then the successor replaces it — from the cycle after the issue (the
        # issue only sets `advance_pending`), before the PE can take another command.
        stale = Signal(range(settle + 1))
        advance_pending = Signal()
        advance = Signal()
        m.d.comb += advance.eq(advance_pending & (stale == 0))
        with m.If(stale != 0):
            m.d.sync += stale.eq(stale - 1)
        with m.If(self.start):
            first_lag = rows[first_row].lag if rows else 0
            m.d.sync += [started.eq(1), have.eq((self.samples != 0) if rows else 0), period.eq(first_lag),
                         pc.eq(first_row), self.issued.eq(0), stale.eq(settle), advance_pending.eq(0)]
            for count in counts:
                m.d.sync += count.eq(0)
        with m.Elif(advance):
            # (`issued` counts each issue here, once, off the issue's own path; it is read after the run.)
            m.d.sync += [have.eq(next_valid), period.eq(next_key >> row_bits), pc.eq(next_key[:row_bits]),
                         stale.eq(settle), advance_pending.eq(0), self.issued.eq(self.issued + 1)]
        with m.Elif(issue):
            m.d.sync += advance_pending.eq(1)

        # ---- when an entry's last step ends, its transfers go to the link senders --------------------
        pending = Signal()
        pending_entry = Signal.like(entry)
        pending_iter = Signal(ibits)
        with m.If(issue & tail):
            m.d.sync += [pending.eq(1), pending_entry.eq(entry), pending_iter.eq(t)]
        with m.Elif(self.pe_done):
            m.d.sync += pending.eq(0)
        m.d.comb += [self.push_valid.eq(pending & self.pe_done), self.push_entry.eq(pending_entry),
                     self.push_iter.eq(pending_iter)]
        return m

    @property
    def tree_levels_per_stage(self) -> int:
        """Comparator levels of the next-row min tree per registered stage: one (the FPGA's clock) while the
        search still settles within the shortest op, else two."""
        levels = max(0, (len(self.rows) - 1).bit_length())
        return 1 if 2 + levels + 2 < op_overhead(self.config.lanes) + 1 else 2

    @property
    def settle_cycles(self) -> int:
        """Cycles after the current row changes until its successor is registered: the candidates (two
        stages), then the min tree's stages (`tree_levels_per_stage` levels each, the root registered)."""
        levels = max(0, (len(self.rows) - 1).bit_length())
        return 2 + -(-levels // self.tree_levels_per_stage)

    def _sample_waits(self) -> dict[int, set[str]]:
        """Per entry, the samples ("x", "y") its steps read from this PE's sample ring."""
        ring = {b.name for b in self.pe.buffers if b.memory == "samples"}
        return {e: {name for step in entry.steps for name in (step.x, step.y) if name in ring}
                for e, entry in enumerate(self.pe.entries)}

    def _lag_of(self, m: Module, pc: Value) -> Value:
        lag = Signal(max(1, self.pe.max_lag).bit_length() + 1, name="lag")
        with m.Switch(pc):
            for i, row in enumerate(self.rows):
                with m.Case(i):
                    m.d.comb += lag.eq(row.lag)
        return lag

    def _command(self, m: Module, cmd: Value, step: Step, t: Value) -> None:
        """Drive `cmd` with the PE command of `step` for iteration `t` (addresses from t, the rest constant)."""
        pe, cfg = self.pe, self.config
        if step.kind in "FA":
            op = _OPCODES[(step.kind, step.relu)]
        else:
            op = {"E": Opcode.ERR, "G": Opcode.GRAD, "U": Opcode.UPD}[step.kind]
        # Every row drives the whole command (fields it does not use are 0): a field no row drives would be a
        # constant-only process in yosys' Verilog (`always @*` without inputs, which Verilator never runs).
        m.d.comb += cmd.eq(0)
        m.d.comb += [cmd.op.eq(op), cmd.rows.eq(step.rows), cmd.cols.eq(step.cols),
                     cmd.col_words.eq(-(-step.cols // cfg.lanes)), cmd.row_words.eq(-(-step.rows // cfg.lanes)),
                     cmd.batch.eq(step.batch)]
        for port, name in ((cmd.x, step.x), (cmd.y, step.y)):
            if name:
                b = pe.buffer(name)
                m.d.comb += [port.bank.eq(pe.bank(b.memory)), port.addr.eq(_ring(t, b))]
        if cfg.strided:  # a micro-batch's vectors: each operand's slot is B samples `pitch // B` words apart
            for port, name in ((cmd.x_stride, step.x), (cmd.y_stride, step.y), (cmd.d_stride, step.dst)):
                if name and step.kind != "U" and not (step.kind == "G" and name == step.dst):
                    m.d.comb += port.eq(pe.buffer(name).pitch // step.batch)
        if step.x_sum:  # a split layer's partial errors: x's slot in other banks (the compiler aligned them)
            x = pe.buffer(step.x)
            for name in step.x_sum:
                b = pe.buffer(name)
                assert (b.base, b.slot_words, b.depth) == (x.base, x.slot_words, x.depth), (name, step.x)
            m.d.comb += cmd.x_sum.eq(sum(1 << pe.bank(pe.buffer(name).memory) for name in step.x_sum))
        if step.window is not None:  # the window engine's op (hdl/_window.py); max pooling's mask goes to y
            m.d.comb += [cmd.window.eq(1), cmd.geom.eq(cfg.windows.index(step.window))]
            if step.mask:
                m.d.comb += [cmd.y.bank.eq(0), cmd.y.addr.eq(_ring(t, pe.buffer(step.mask)))]

        def version(offset: int) -> Value | int:
            """Slot of weight version max(0, t + offset) in W's ring of versions."""
            b = pe.buffer(step.w)
            if b.depth == 1:
                return b.base
            v = Signal(self.iteration_bits + 1, name=f"version_{step.kind}{step.layer}_{offset + 64}")
            shifted = t + offset  # t is unsigned: the sum widens to a signed shape that holds t − |offset|
            m.d.comb += v.eq(Mux(shifted < 0, 0, shifted) if offset < 0 else shifted)
            return _ring(v, b)

        if step.kind in "FE" and step.w:
            m.d.comb += cmd.w.eq(version(step.version))
        if step.kind == "U":
            m.d.comb += [cmd.w.eq(version(0)), cmd.dst.eq(version(1)), cmd.g.eq(_ring(t, pe.buffer(step.g)))]
        else:
            m.d.comb += cmd.dst.eq(_ring(t, pe.buffer(step.dst)))


def _all(terms: list[Value]) -> Value:
    out: Value = Const(1, 1)
    for term in terms:
        out = out & term
    return out


def _min_tree(m: Module, items: list[tuple[Value, Value]], levels_per_stage: int = 0) -> tuple[Value, Value]:
    """(any valid, smallest key among the valid ones): a balanced tree of comparators, registered after every
    `levels_per_stage` levels (0: combinational) and at its root."""
    if not items:
        return Const(0, 1), Const(0, 1)  # a PE with nothing to run
    level = 0
    while len(items) > 1:
        paired = []
        registered = levels_per_stage > 0 and ((level + 1) % levels_per_stage == 0 or len(items) <= 2)
        domain = m.d.sync if registered else m.d.comb
        for i in range(0, len(items) - 1, 2):
            (va, ka), (vb, kb) = items[i], items[i + 1]
            take_b = ~va | (vb & (kb < ka))
            v = Signal(name=f"min_v{level}_{i}")
            k = Signal.like(ka, name=f"min_k{level}_{i}")
            domain += [v.eq(va | vb), k.eq(Mux(take_b, kb, ka))]
            paired.append((v, k))
        if len(items) % 2:
            va, ka = items[-1]
            if registered:  # the odd item keeps pace with its registered siblings
                v, k = Signal(name=f"min_v{level}_odd"), Signal.like(ka, name=f"min_k{level}_odd")
                m.d.sync += [v.eq(va), k.eq(ka)]
                va, ka = v, k
            paired.append((va, ka))
        items = paired
        level += 1
    return items[0]
