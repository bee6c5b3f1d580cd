"""The window engine of a PE: the loop-nest address generator and the scalar datapath of conv2d, pooling and
flatten ops (their nests, cycles and values: `hdl/_conv.py`).

The PE elaborates one engine when its program has window steps (`PEConfig.windows`, a table of the geometries
of its ops; a command names its row by `geom`). The engine shares the PE's memories and pipeline front: its
addresses go through the PE's address registers, the memories read them, the read-data registers hold the
words; so a beat issued in cycle c has its words in c + FRONT_STAGES like a matrix walk's, and its result is
written `latency(lanes)` cycles later, as the op overhead of the `rtl` cost model says.

Loop nest: seven counters k0..k6, outer four (the output element; G: its (o, c, i, j)) and inner three (the
reduction), as an odometer: the innermost counts every beat. Per op the levels are

    conv F  b o h w | c i j      conv E  b c y x | o i j      conv G  o c i j | b h w
    pool F  b c h w | - i j      pool E  b c y x | - i j      copy    b - - n | - - -

Addresses are affine in the counters with the geometry's constants (shift-and-add, no multiplier); an input
row of E, y + p − i, is divided by the stride with a small table (its range is the image height plus the
kernel). Elements are (word = index >> log2 lanes, lane = index & (lanes − 1)): lanes a power of two.

Datapath after the words (each stage ends in a register):
    E0 bank and lane select of the two elements P, Q      E1 term: P·Q (conv), P (pool, copy), masked
    E2 accumulate (sum, or max with its first arg max)    E3 finish: rescale / round / saturate / ReLU
    E4 pack the element into its output word (a word is written when full or at the end of its row)
then a delay line to `latency(lanes)`; max pooling's mask word is written the cycle after its value word.
"""

from __future__ import annotations

from amaranth.hdl import Const, Elaboratable, Module, Mux, Signal, Value, signed, unsigned

from layerpipe.errors import InputError
from layerpipe.fixedpoint import FixedFormat
from layerpipe.hdl._conv import Window
from layerpipe.hdl._datapath import latency, mul_const, round_shift, saturate, word_layout

__all__ = ["ENGINE_STAGES", "WindowEngine", "check_window_lanes", "levels"]

#: Stages of the engine's datapath (E0..E4) before its delay line to `latency(lanes)`.
ENGINE_STAGES = 5


def check_window_lanes(lanes: int) -> None:
    if lanes & (lanes - 1):
        raise InputError(f"the RTL's window engine (conv2d, pooling, flatten) needs --lanes a power of two, got "
                         f"{lanes}")


def levels(wd: Window) -> tuple[int, ...]:
    """The seven loop counts of `wd`'s nest (see the module docstring)."""
    b, k = wd.batch, wd.kernel
    return {"conv_f": (b, wd.out_channels, wd.out_h, wd.out_w, wd.channels, k, k),
            "conv_e": (b, wd.channels, wd.height, wd.width, wd.out_channels, k, k),
            "conv_g": (wd.out_channels, wd.channels, k, k, b, wd.out_h, wd.out_w),
            "pool_f": (b, wd.channels, wd.out_h, wd.out_w, 1, k, k),
            "pool_e": (b, wd.channels, wd.height, wd.width, 1, k, k),
            "copy": (b, 1, 1, wd.in_elements, 1, 1, 1)}[wd.op]


def _words(elements: int, lanes: int) -> int:
    return -(-elements // lanes)


def _signed(m: Module, v: Value, name: str) -> Value:
    """v (unsigned) as a signed signal of one more bit (a plain zero-extending assignment, so the arithmetic
    cells after it add signed wires)."""
    out = Signal(signed(len(v) + 1), name=name)
    m.d.comb += out.eq(v)
    return out


class WindowEngine(Elaboratable):
    """Inputs: `start` (the PE accepts a window command this cycle) and the command's fields; the read-data words
    of the PE (per bank x / y, and the weight word). Outputs: `x_addr`, `y_addr`, `w_addr`, `issuing` (the
    beat's addresses, registered by the PE), the write (`we`, `w_grads`, `waddr`, `wdata`) and `done`."""

    def __init__(self, windows: tuple[Window, ...], lanes: int, fmt: FixedFormat, banks: int, vector_bits: int,
                 weight_bits: int, dst_bits: int) -> None:
        check_window_lanes(lanes)
        self.windows, self.lanes, self.fmt, self.banks = windows, lanes, fmt, banks
        self.lg = lanes.bit_length() - 1
        self.latency = latency(lanes)
        word = word_layout(lanes, fmt)
        n = fmt.total_bits
        self.start = Signal()
        self.geom = Signal(range(max(2, len(windows))))
        self.x_base, self.y_base = Signal(vector_bits), Signal(vector_bits)
        self.x_bank, self.y_bank = Signal(range(max(2, banks))), Signal(range(max(2, banks)))
        self.w_base = Signal(weight_bits)
        self.dst = Signal(dst_bits)
        self.x_words = [Signal(word, name=f"we_x{k}") for k in range(banks)]
        self.y_words = [Signal(word, name=f"we_y{k}") for k in range(banks)]
        self.w_word = Signal(word)
        self.issuing = Signal()
        self.beat_valid = Signal()  # S1: a beat's addresses are in the PE's address registers
        self.x_addr, self.y_addr = Signal(vector_bits), Signal(vector_bits)
        self.w_addr = Signal(weight_bits)
        self.we = Signal()
        self.w_grads = Signal()  # the write goes to the gradient memory (conv G), else bank 0
        self.waddr = Signal(dst_bits)
        self.wdata = Signal(word)
        self.done = Signal()
        self.count = max(max(levels(w)) for w in windows)
        reduction = max(w.reduction for w in windows)
        self.acc_bits = min(64, 2 * n + reduction.bit_length() + 2)

    def _table(self, m: Module, geom: Value, values: list[int], shape: object, name: str) -> Value:
        """A per-geometry constant (a mux on the command's geometry)."""
        out = Signal(shape, name=name)
        if len(set(values)) == 1:
            m.d.comb += out.eq(values[0])
            return out
        with m.Switch(geom):
            for g, v in enumerate(values):
                with m.Case(g):
                    m.d.comb += out.eq(v)
        return out

    def elaborate(self, platform: object) -> Module:
        m = Module()
        wins, lanes, lg = self.windows, self.lanes, self.lg
        n = self.fmt.total_bits
        word = word_layout(lanes, self.fmt)
        geom = Signal.like(self.geom)
        x_base, y_base, w_base, dst = (Signal.like(s) for s in (self.x_base, self.y_base, self.w_base, self.dst))
        x_bank, y_bank = Signal.like(self.x_bank), Signal.like(self.y_bank)
        ctr = [Signal(range(self.count + 1), name=f"k{i}") for i in range(7)]
        with m.If(self.start):
            m.d.sync += [geom.eq(self.geom), x_base.eq(self.x_base), y_base.eq(self.y_base), w_base.eq(self.w_base),
                         dst.eq(self.dst), x_bank.eq(self.x_bank), y_bank.eq(self.y_bank), self.issuing.eq(1)]
            m.d.sync += [c.eq(0) for c in ctr]

        # ---- S0: the odometer and the beat's addresses ---------------------------------------------------
        tops = [ctr[i] == self._table(m, geom, [levels(w)[i] - 1 for w in wins], range(self.count + 1), f"top{i}")
                for i in range(7)]
        first = (ctr[4] == 0) & (ctr[5] == 0) & (ctr[6] == 0)
        last = tops[4] & tops[5] & tops[6]
        row_end = last & tops[1] & tops[2] & tops[3]
        final = row_end & tops[0]
        with m.If(self.issuing & ~self.start):
            carry: Value = Const(1, 1)
            for i in reversed(range(7)):
                with m.If(carry):
                    m.d.sync += ctr[i].eq(Mux(tops[i], 0, ctr[i] + 1))
                carry = carry & tops[i]
            with m.If(final):
                m.d.sync += self.issuing.eq(0)

        x_el = Signal(signed(32))
        y_el = Signal(signed(32))
        w_el = Signal(signed(32))
        w_row = Signal(unsigned(32))
        x_sample, y_sample = Signal(unsigned(32)), Signal(unsigned(32))
        inwin = Signal()
        tap = Signal(range(max(2, max(w.kernel ** 2 for w in wins))))
        with m.Switch(geom):
            for g, wd in enumerate(wins):
                with m.Case(g):
                    self._beat(m, wd, ctr, x_el, y_el, w_el, w_row, x_sample, y_sample, inwin, tap)
        # Word offsets as unsigned address-wide values (an element outside the image is masked: its address,
        # whatever it wraps to, is read and ignored).
        x_off, y_off, w_off = Signal.like(self.x_addr), Signal.like(self.y_addr), Signal.like(self.w_addr)
        m.d.comb += [x_off.eq(x_el >> lg), y_off.eq(y_el >> lg), w_off.eq(w_el >> lg)]
        m.d.comb += [self.x_addr.eq(x_base + x_sample + x_off), self.y_addr.eq(y_base + y_sample + y_off),
                     self.w_addr.eq(w_base + w_row + w_off)]
        mask = lanes - 1
        ctl = {"valid": 1, "inwin": 1, "first": 1, "last": 1, "row_end": 1, "final": 1, "tap": len(tap),
               **({"xl": lg, "yl": lg, "wl": lg} if lanes > 1 else {})}  # the elements' lanes
        stage = {k: Signal(v, name=f"s0_{k}") for k, v in ctl.items()}
        m.d.comb += [stage["valid"].eq(self.issuing & ~self.start), stage["inwin"].eq(inwin),
                     stage["first"].eq(first), stage["last"].eq(last), stage["row_end"].eq(row_end),
                     stage["final"].eq(final), stage["tap"].eq(tap)]
        if lanes > 1:
            m.d.comb += [stage["xl"].eq(x_el & mask), stage["yl"].eq(y_el & mask), stage["wl"].eq(w_el & mask)]
        for s in range(1, 4):  # S1 (memory read), S2 (read-data registers), E0
            nxt = {k: Signal(v, name=f"s{s}_{k}") for k, v in ctl.items()}
            m.d.sync += [nxt[k].eq(stage[k]) for k in ctl]
            stage = nxt
            if s == 1:
                m.d.comb += self.beat_valid.eq(stage["valid"])

        # ---- E0: the two elements ----------------------------------------------------------------------
        def pick(words: list[Signal], bank: Value) -> Value:
            out = Signal(word)
            with m.Switch(bank):
                for k, w in enumerate(words):
                    with m.Case(k):
                        m.d.comb += out.eq(w)
            return out

        def lane(w: Value, index: Value, name: str) -> Value:
            out = Signal(signed(n), name=name)
            with m.Switch(index if lanes > 1 else Const(0, 1)):
                for j in range(lanes):
                    with m.Case(j):
                        m.d.comb += out.eq(w[j])
            return out

        xw, yw = pick(self.x_words, x_bank), pick(self.y_words, y_bank)
        zero = Const(0, 1)
        xe, ye = lane(xw, stage.get("xl", zero), "xe"), lane(yw, stage.get("yl", zero), "ye")
        we_ = lane(self.w_word, stage.get("wl", zero), "wle")
        kind = {w.op for w in wins}
        p_from_y = self._table(m, geom, [int(w.op in ("conv_e", "conv_g")) for w in wins], 1, "p_from_y")
        q_sel = self._table(m, geom, [{"conv_f": 2, "conv_e": 2, "conv_g": 0}.get(w.op, 1) for w in wins], 2, "q_sel")
        pe, qe = Signal(signed(n)), Signal(signed(n))
        m.d.sync += [pe.eq(Mux(p_from_y, ye, xe)), qe.eq(Mux(q_sel == 2, we_, Mux(q_sel == 1, ye, xe)))]
        e1 = self._delay(m, stage, "e1", ("valid", "inwin", "first", "last", "row_end", "final", "tap"))

        # ---- E1: the term ------------------------------------------------------------------------------
        mode = self._table(m, geom, [_MODES[_mode(w)] for w in wins], range(len(_MODES)), "mode")
        shift = self._table(m, geom, [(w.kernel ** 2).bit_length() - 1 for w in wins], range(32), "pool_shift")
        term = Signal(signed(2 * n + 1))
        pooled_e = Signal(signed(n + 1))
        with m.Switch(shift):
            for sh in sorted({(w.kernel ** 2).bit_length() - 1 for w in wins}):
                with m.Case(sh):
                    m.d.comb += pooled_e.eq(round_shift(pe, sh))
        with m.Switch(mode):
            with m.Case(_MODES["conv"]):
                m.d.sync += term.eq(Mux(e1["inwin"], pe * qe, 0))
            with m.Case(_MODES["max_e"]):
                m.d.sync += term.eq(Mux(e1["inwin"] & (qe == e1["tap"]), pe, 0))
            with m.Case(_MODES["avg_e"]):
                m.d.sync += term.eq(Mux(e1["inwin"], pooled_e, 0))
            with m.Case(_MODES["avg_f"]):
                m.d.sync += term.eq(Mux(e1["inwin"], pe, 0))
            with m.Default():  # max F, copy: the element itself
                m.d.sync += term.eq(pe)
        e2 = self._delay(m, e1, "e2", ("valid", "first", "last", "row_end", "final",
                                       *(("inwin", "tap") if "pool_f" in kind else ())))  # max pooling's arg max

        # ---- E2: accumulate ----------------------------------------------------------------------------
        acc = Signal(signed(self.acc_bits))
        arg = Signal.like(tap)
        have = Signal()
        with m.If(e2["valid"]):
            if "pool_f" in kind:  # max pooling: the maximum and its first arg max (padding never wins)
                with m.If(mode == _MODES["max_f"]):
                    with m.If(e2["first"]):
                        m.d.sync += [acc.eq(term), arg.eq(e2["tap"]), have.eq(e2["inwin"])]
                    with m.Elif(e2["inwin"] & (~have | (term > acc))):  # strictly greater: the first maximum wins
                        m.d.sync += [acc.eq(term), arg.eq(e2["tap"]), have.eq(1)]
                with m.Else():
                    m.d.sync += acc.eq(Mux(e2["first"], 0, acc) + term)
            else:
                m.d.sync += acc.eq(Mux(e2["first"], 0, acc) + term)
        e3 = self._delay(m, e2, "e3", ("valid", "last", "row_end", "final"))

        # ---- E3: finish --------------------------------------------------------------------------------
        relu = self._table(m, geom, [int(w.relu) for w in wins], 1, "relu")
        res = Signal(signed(n))
        res_mask = Signal(signed(n))
        res_valid = Signal()
        conv_value = Signal(signed(n))
        m.d.comb += conv_value.eq(saturate(round_shift(acc, self.fmt.frac_bits), n))
        avg_value = Signal(signed(n))
        with m.Switch(shift):
            for sh in sorted({(w.kernel ** 2).bit_length() - 1 for w in wins}):
                with m.Case(sh):
                    m.d.comb += avg_value.eq(saturate(round_shift(acc, sh), n))
        finished = Signal(signed(n))
        with m.Switch(mode):
            with m.Case(_MODES["conv"]):
                m.d.comb += finished.eq(Mux(relu & (conv_value < 0), 0, conv_value))
            with m.Case(_MODES["avg_f"]):
                m.d.comb += finished.eq(avg_value)
            with m.Default():  # max F (the maximum), pool E (a saturated sum), copy
                m.d.comb += finished.eq(saturate(acc, n))
        m.d.sync += [res.eq(finished), res_mask.eq(arg), res_valid.eq(e3["valid"] & e3["last"])]
        e4 = self._delay(m, e3, "e4", ("row_end", "final"))

        # ---- E4: pack elements into words --------------------------------------------------------------
        out_lane = Signal(range(lanes))
        packed, packed_mask = Signal(word), Signal(word)
        value_word, mask_word = Signal(word), Signal(word)
        m.d.comb += [value_word.eq(packed), mask_word.eq(packed_mask)]
        for j in range(lanes):
            with m.If(out_lane == j):
                m.d.comb += [value_word[j].eq(res), mask_word[j].eq(res_mask)]
        emit = res_valid & ((out_lane == lanes - 1) | e4["row_end"])
        waddr = Signal(len(self.dst))  # the next output word
        maddr, mrow = Signal(len(self.y_base)), Signal(len(self.y_base))  # max pooling: mask word, its row's first
        mask_row_words = self._table(m, geom, [_words(w.in_elements, lanes) for w in wins], range(1 << 20),
                                     "mask_row_words")
        with m.If(self.start):
            m.d.sync += [waddr.eq(self.dst), maddr.eq(self.y_base), mrow.eq(self.y_base), out_lane.eq(0),
                         packed.eq(0), packed_mask.eq(0)]
        with m.Elif(res_valid):
            m.d.sync += [packed.eq(Mux(emit, 0, value_word)), packed_mask.eq(Mux(emit, 0, mask_word)),
                         out_lane.eq(Mux(emit, 0, out_lane + 1))]
            with m.If(emit):
                m.d.sync += waddr.eq(waddr + 1)
                with m.If(e4["row_end"]):
                    m.d.sync += [mrow.eq(mrow + mask_row_words), maddr.eq(mrow + mask_row_words)]
                with m.Else():
                    m.d.sync += maddr.eq(maddr + 1)
        out = {"valid": Signal(), "final": Signal(), "addr": Signal(len(self.dst)), "data": Signal(word),
               "maddr": Signal(len(self.y_base)), "mdata": Signal(word)}
        m.d.sync += [out["valid"].eq(emit), out["final"].eq(emit & e4["final"]), out["addr"].eq(waddr),
                     out["data"].eq(value_word), out["maddr"].eq(maddr), out["mdata"].eq(mask_word)]
        for s in range(self.latency - ENGINE_STAGES):  # the delay line to the PE's write cycle
            nxt = {k: Signal.like(v, name=f"wd{s}_{k}") for k, v in out.items()}
            m.d.sync += [nxt[k].eq(out[k]) for k in out]
            out = nxt
        # Max pooling: the mask word one cycle after its value word (words are ≥ 4 beats apart: K ≥ 2).
        with_mask = self._table(m, geom, [int(_mode(w) == "max_f") for w in wins], 1, "with_mask")
        m_valid, m_final = Signal(), Signal()
        m_addr, m_data = Signal(len(self.y_base)), Signal(word)
        m.d.sync += [m_valid.eq(out["valid"] & with_mask), m_final.eq(out["final"] & with_mask),
                     m_addr.eq(out["maddr"]), m_data.eq(out["mdata"])]
        to_grads = self._table(m, geom, [int(w.op == "conv_g") for w in wins], 1, "to_grads")
        m.d.comb += [self.we.eq(out["valid"] | m_valid), self.w_grads.eq(to_grads & ~m_valid),
                     self.waddr.eq(Mux(m_valid, m_addr, out["addr"])), self.wdata.eq(Mux(m_valid, m_data, out["data"])),
                     self.done.eq((out["final"] & ~with_mask) | m_final)]
        return m

    @staticmethod
    def _delay(m: Module, stage: dict[str, Signal], name: str, keep: tuple[str, ...]) -> dict[str, Signal]:
        """The fields `keep` of a beat's control, one stage down the pipeline."""
        nxt = {k: Signal.like(stage[k], name=f"{name}_{k}") for k in keep}
        m.d.sync += [nxt[k].eq(stage[k]) for k in keep]
        return nxt

    def _beat(self, m: Module, wd: Window, ctr: list[Signal], x_el: Signal, y_el: Signal, w_el: Signal,
              w_row: Signal, x_sample: Signal, y_sample: Signal, inwin: Signal, tap: Signal) -> None:
        """The addresses (element indices, sample offsets) and the window mask of one beat of `wd`."""
        lanes = self.lanes
        k, s, p = wd.kernel, wd.stride, wd.padding
        c_in = _words(wd.in_elements, lanes)
        c_out = _words(wd.out_elements, lanes)
        row_words = _words(wd.taps, lanes)

        def forward_input(c: Value, h: Value, i: Value, w: Value, j: Value) -> tuple[Value, Value]:
            """Element of x_pad[c, h·s + i − p, w·s + j − p] and whether it is inside the image."""
            row = _signed(m, mul_const(h, s), "hs") + _signed(m, i, "i_s") - p
            col = _signed(m, mul_const(w, s), "ws") + _signed(m, j, "j_s") - p
            ok = (row >= 0) & (row < wd.height) & (col >= 0) & (col < wd.width)
            return _signed(m, mul_const(c, wd.height * wd.width), "chw") + _mul_signed(row, wd.width) + col, ok

        def backward_output(y: Value, i: Value, size: int, out: int, name: str) -> tuple[Value, Value]:
            """(y + p − i) / s when exact and inside the output (a table on y + p − i + K − 1 ≥ 0)."""
            r = Signal(range(size + 2 * k + 2 * p + 1), name=f"r_{name}")
            m.d.comb += r.eq(y + (p + k - 1) - i)
            q, ok = Signal(range(out + 1), name=f"q_{name}"), Signal(name=f"ok_{name}")
            with m.Switch(r):
                for value in range(size + p + k):
                    real = value - (k - 1)
                    if real >= 0 and real % s == 0 and real // s < out:
                        with m.Case(value):
                            m.d.comb += [q.eq(real // s), ok.eq(1)]
            return q, ok

        if wd.op in ("conv_f", "conv_g", "pool_f"):
            if wd.op == "conv_f":
                b, o, h, w, c, i, j = ctr
            elif wd.op == "conv_g":
                o, c, i, j, b, h, w = ctr
            else:
                b, c, h, w, _, i, j = ctr
                o = c
            el, ok = forward_input(c, h, i, w, j)
            out_el = mul_const(o, wd.out_h * wd.out_w) + mul_const(h, wd.out_w) + w
            cij = mul_const(c, k * k) + mul_const(i, k) + j
            m.d.comb += [inwin.eq(ok), tap.eq(mul_const(i, k) + j), x_el.eq(el), x_sample.eq(mul_const(b, c_in))]
            if wd.op == "conv_g":
                m.d.comb += [y_el.eq(out_el), y_sample.eq(mul_const(b, c_out))]
            else:
                m.d.comb += [w_el.eq(cij), w_row.eq(mul_const(o, row_words))]
            return
        if wd.op == "copy":
            b, _, _, idx, _, _, _ = ctr
            m.d.comb += [inwin.eq(1), x_el.eq(idx), x_sample.eq(mul_const(b, c_in))]
            return
        if wd.op == "conv_e":
            b, c, y, x, o, i, j = ctr
        else:
            b, c, y, x, _, i, j = ctr
            o = c
        hh, ok_h = backward_output(y, i, wd.height, wd.out_h, "h")
        ww, ok_w = backward_output(x, j, wd.width, wd.out_w, "w")
        out_el = mul_const(o, wd.out_h * wd.out_w) + mul_const(hh, wd.out_w) + ww
        m.d.comb += [inwin.eq(ok_h & ok_w), tap.eq(mul_const(i, k) + j)]
        if wd.op == "conv_e":  # P = δ (the y operand), Q = W[o, c, i, j]
            m.d.comb += [y_el.eq(out_el), y_sample.eq(mul_const(b, c_out)),
                         w_el.eq(mul_const(c, k * k) + mul_const(i, k) + j), w_row.eq(mul_const(o, row_words))]
        else:  # P = e (x operand), Q = the argmax mask (y operand: rows of the pooling's input size)
            m.d.comb += [x_el.eq(out_el), x_sample.eq(mul_const(b, c_out)), y_el.eq(out_el),
                         y_sample.eq(mul_const(b, c_in))]


def _mul_signed(value: Value, factor: int) -> Value:
    """value · factor for a signed value and a constant factor ≥ 0 (shift-and-add)."""
    terms = [value << bit for bit in range(factor.bit_length()) if factor >> bit & 1]
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


_MODES = {"conv": 0, "max_f": 1, "avg_f": 2, "max_e": 3, "avg_e": 4, "copy": 5}


def _mode(wd: Window) -> str:
    if wd.op.startswith("conv"):
        return "conv"
    if wd.op == "copy":
        return "copy"
    return f"{wd.mode}_{wd.op[-1]}"
