"""The arithmetic of the processing element: `lanes` multipliers, an adder tree, full-width accumulators,
rescale/saturate, the ReLU mask and U's subtract-with-shift — exactly `layerpipe.fixedpoint`'s rules.

The datapath is the back half of the PE pipeline (`hdl/_pe.py` has the front: address registers, memory read,
read-data registers). It takes a beat's operands in stage D0 and is pipelined for the FPGA's clock (every
stage ends in a register; no path runs memory → multiplier or multiplier → accumulator in one cycle):

    D0  (comb)  lane mux of δ_i, the multiplier operands, elementwise results   → registers `mul_a`, `mul_b`, `ew`
    D1  (comb)  the lane multiplies (one DSP each, registered on both sides)   → register `p`      (2·n-bit)
    D2… (comb)  adder tree (F), two levels per stage (`tree_stages(lanes)`)     → register `addend` (full width)
    D+1 (comb)  accumulate                                                      → register `acc`    (full width)
    D+2 (comb)  round: acc + 2^(f−1) (ops that rescale)                         → register `pre`
    D+3 (comb)  saturate (+ ReLU, + F's word packing)                           → registers `out_data`, `out_valid`

so a beat's result is on `out_data` `latency(lanes)` = 5 + tree_stages(lanes) cycles after its operands are on
the inputs. Every beat carries its own control (op, first/last of an accumulation, the lane of a row element,
the valid-lane mask), so consecutive beats of different rows never need a bubble. Which operand means what,
per op:

    FWD_*    p_j = W_j · X_j                       acc0 += Σ_j p_j        out lane `lane` = act(rescale(acc0))
    ERR      p_j = W_j · Y[lane]                   acc_j += p_j           out_j = rescale(acc_j)
    GRAD     p_j = Y[lane] · X_j                   acc_j  = p_j           out_j = rescale(acc_j)
    ACT_RELU p_j = X_j if Y_j > 0 else 0           acc_j  = p_j           out_j = acc_j
    OUT_ERR  p_j = sat(X_j − Y_j)                  acc_j  = p_j           out_j = acc_j
    UPD      p_j = sat(W_j − round_shift(G_j, k))  acc_j  = p_j           out_j = acc_j

Lanes outside the valid mask (the padding of a row's last word) produce 0, so padding stays zero.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, Value, signed, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from layerpipe._rtl_costs import TREE_LEVELS_PER_STAGE, latency, tree_levels, tree_stages
from layerpipe.fixedpoint import FixedFormat

__all__ = ["Datapath", "Opcode", "latency", "mul_const", "rescale", "round_shift", "saturate", "tree_levels",
           "tree_stages", "word_layout"]

class Opcode(enum.Enum, shape=3):  # type: ignore[call-arg]  # amaranth.lib.enum takes shape
    """The operations the PE executes; one microcode entry runs one of them over one layer."""

    FWD_LINEAR = 0  #: F of an identity layer: z = rescale(W a)
    FWD_RELU = 1  #: F of a ReLU layer: a' = relu(rescale(W a))
    ACT_RELU = 2  #: A of a ReLU layer: δ = e ⊙ (a' > 0)   ((a' > 0) ⟺ (z > 0) since a' = max(z, 0))
    OUT_ERR = 3  #: A of the identity output layer under ½‖a − y‖²: δ = e_L = sat(a − y)
    ERR = 4  #: E: e_prev = rescale(Wᵀ δ)
    GRAD = 5  #: G: g = rescale(δ aᵀ)
    UPD = 6  #: U: W ← sat(W − round_shift(g, k))


def word_layout(lanes: int, fmt: FixedFormat) -> data.ArrayLayout:
    """A memory word: `lanes` signed elements, lane 0 in the low bits."""
    return data.ArrayLayout(signed(fmt.total_bits), lanes)


def saturate(value: Value, width: int) -> Value:
    """Clamp a signed value to the signed `width`-bit range (the result has exactly that shape).

    The value fits when its bits from `width − 1` up are all equal (the sign extension of the result); that
    test is a reduction over those bits (a shallow LUT tree on an FPGA), not two full-width comparisons."""
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    value = value.as_signed()
    if len(value) <= width:
        return value  # already in range; the assignment sign-extends it
    top = value[width - 1:]
    fits = (top == 0) | (top == (1 << len(top)) - 1)
    clamped = Mux(fits, value[:width], Mux(value[-1], lo, hi))
    return clamped[:width].as_signed()


def mul_const(value: Value, factor: int) -> Value:
    """value · factor for a constant factor ≥ 0, as a sum of shifted copies (adders, never a DSP)."""
    if factor < 0:
        raise ValueError(f"mul_const takes a factor >= 0, got {factor}")
    terms = [value << bit for bit in range(factor.bit_length()) if factor >> bit & 1]
    if not terms:
        return Const(0, 1)
    return _adder_tree(terms)


def iteration_sum_shape(iteration_bits: int, low: int, high: int) -> Shape:
    """A signed shape that holds t + k for every iteration t < 2^iteration_bits and offset k in [low, high]: at
    least the `signed(iteration_bits + 2)` the sequencer and links always used (their Verilog is unchanged where
    that was enough), wider where an offset is larger than the iterations. With T = 1 (one iteration bit) a
    weight copy sent at version t − 5 wrapped to slot 3 in three bits: the copy read zeros (issue 16's
    generated-placement bench, stash mode, B = 4)."""
    span = Shape.cast(range(min(0, low), (1 << iteration_bits) + max(0, high)))
    return signed(max(iteration_bits + 2, span.width + (0 if span.signed else 1)))


def round_shift(value: Value, shift: int) -> Value:
    """(v + 2^(shift−1)) >> shift, arithmetic: round half up, as `fixedpoint._round_shift`."""
    value = value.as_signed()
    if shift == 0:
        return value
    # One extra bit so that adding the rounding term to the most positive value cannot wrap.
    widened = value + Const(1 << (shift - 1), unsigned(shift))
    return widened >> shift


def rescale(acc: Value, fmt: FixedFormat) -> Value:
    """sat((acc + 2^(f−1)) >> f) to the format's width."""
    return saturate(round_shift(acc, fmt.frac_bits), fmt.total_bits)


class Datapath(wiring.Component):
    """Stages D0 … D+3 of the PE: see the module docstring. `acc_bits` is the accumulator width."""

    def __init__(self, lanes: int, fmt: FixedFormat, lr_shift: int, acc_bits: int) -> None:
        self.lanes = lanes
        self.fmt = fmt
        self.lr_shift = lr_shift
        self.acc_bits = acc_bits
        self.latency = latency(lanes)
        word = word_layout(lanes, fmt)
        super().__init__({
            # Control of the beat whose operands are on the inputs (stage D0).
            "valid": In(1),
            "op": In(Opcode),
            "first": In(1),  # start a new accumulation (acc ← addend instead of acc + addend)
            "last": In(1),  # the accumulation is complete after this beat (F: end of row)
            "emit": In(1),  # this beat writes a result word
            "lane": In(range(lanes)),  # F: output lane of the row element; ERR/GRAD: lane of δ_i in Y
            "mask": In(lanes),  # valid lanes of the beat (padding lanes of a row's last word are 0)
            "x": In(word),
            "y": In(word),
            "w": In(word),
            "g": In(word),
            # Result, `latency` cycles after the beat's operands.
            "out_valid": Out(1),
            "out_data": Out(word),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        n, lanes = self.fmt.total_bits, self.lanes
        op = self.op
        d0 = self._control(m, "d0", self.valid, op, self.first, self.last, self.emit, self.lane)

        # ---- D0: operands of the multipliers and elementwise results -----------------------------------
        # One multiplier per lane, shared by F, E and G: the operands are muxed in front of it.
        scalar_y = Signal(signed(n))  # δ_i: lane `lane` of the Y word (the δ vector), broadcast to all lanes
        with m.Switch(self.lane):  # a lane mux (indexing the view by a Value would build a shifter)
            for j in range(lanes):
                with m.Case(j):
                    m.d.comb += scalar_y.eq(self.y[j])
        is_mac = _is_fwd(op) | (op == Opcode.ERR) | (op == Opcode.GRAD)
        mul_a = Signal(data.ArrayLayout(signed(n), lanes))
        mul_b = Signal(data.ArrayLayout(signed(n), lanes))
        ew = Signal(data.ArrayLayout(signed(n), lanes))  # elementwise results, 0 in masked lanes
        sel = Signal(data.ArrayLayout(unsigned(2), lanes))  # per lane: bit 0 keep, bit 1 take the product
        for j in range(lanes):
            x, y, w, g = self.x[j], self.y[j], self.w[j], self.g[j]
            elementwise = Signal(signed(n), name=f"elementwise{j}")
            with m.Switch(op):
                with m.Case(Opcode.ACT_RELU):
                    m.d.comb += elementwise.eq(Mux(y > 0, x, 0))
                with m.Case(Opcode.OUT_ERR):
                    m.d.comb += elementwise.eq(saturate(x - y, n))
                with m.Case(Opcode.UPD):
                    m.d.comb += elementwise.eq(saturate(w - round_shift(g, self.lr_shift), n))
            # U updates every lane (W's padding stays as it is: g's padding is 0); the other ops zero padding.
            keep = self.mask[j] | (op == Opcode.UPD)
            m.d.sync += [mul_a[j].eq(Mux((op == Opcode.ERR) | (op == Opcode.GRAD), scalar_y, x)),
                         mul_b[j].eq(Mux(op == Opcode.GRAD, x, w)), ew[j].eq(elementwise),
                         sel[j].eq(Cat(keep, is_mac))]

        # ---- D1: the products (registered operands in, registered product out: the DSP's own stage) ------
        d1 = self._control(m, "d1", d0.valid, d0.op, d0.first, d0.last, d0.emit, d0.lane)
        p = Signal(data.ArrayLayout(signed(2 * n), lanes))
        for j in range(lanes):
            product = Signal(signed(2 * n), name=f"product{j}")
            m.d.comb += product.eq(mul_a[j] * mul_b[j])
            m.d.sync += p[j].eq(Mux(sel[j][0], Mux(sel[j][1], product, ew[j]), 0))

        # ---- D2…: adder tree (F sums the lanes into lane 0; E accumulates per lane; the rest pass p) ------
        ctl = self._control(m, "d2", d1.valid, d1.op, d1.first, d1.last, d1.emit, d1.lane)
        terms: list[Value] = [p[j] for j in range(lanes)]
        lane_values: list[Value] = [p[j] for j in range(lanes)]
        levels = tree_levels(lanes)
        stages = tree_stages(lanes)
        addend = Signal(data.ArrayLayout(signed(self.acc_bits), lanes))
        for stage in range(stages):
            for _ in range(min(TREE_LEVELS_PER_STAGE, levels - stage * TREE_LEVELS_PER_STAGE)):
                terms = _tree_level(terms)
            if stage == stages - 1:
                fwd = _is_fwd(ctl.op)
                for j in range(lanes):
                    m.d.sync += addend[j].eq(Mux(fwd, terms[0] if j == 0 else 0, lane_values[j]))
                break
            # An inner tree stage: register the partial sums and the lanes' own products alongside.
            staged = [Signal(signed(self.acc_bits), name=f"tree{stage}_{i}") for i in range(len(terms))]
            held = [Signal(signed(2 * n), name=f"held{stage}_{j}") for j in range(lanes)]
            m.d.sync += [s.eq(t) for s, t in zip(staged, terms, strict=True)]
            m.d.sync += [h.eq(v) for h, v in zip(held, lane_values, strict=True)]
            terms, lane_values = list(staged), list(held)
            ctl = self._control(m, f"d2_{stage + 1}", ctl.valid, ctl.op, ctl.first, ctl.last, ctl.emit, ctl.lane)
        s_acc = self._control(m, "acc_ctl", ctl.valid, ctl.op, ctl.first, ctl.last, ctl.emit, ctl.lane)

        # ---- accumulate -------------------------------------------------------------------------------
        acc = Signal(data.ArrayLayout(signed(self.acc_bits), lanes))
        with m.If(s_acc.valid):
            for j in range(lanes):
                m.d.sync += acc[j].eq(Mux(s_acc.first, 0, acc[j]) + addend[j])
        s_pre = self._control(m, "pre_ctl", s_acc.valid, s_acc.op, s_acc.first, s_acc.last, s_acc.emit, s_acc.lane)

        # ---- round (the ops that rescale; elementwise results pass, already saturated in D0) -----------
        rounds = _is_fwd(s_pre.op) | (s_pre.op == Opcode.ERR) | (s_pre.op == Opcode.GRAD)
        pre = Signal(data.ArrayLayout(signed(self.acc_bits + 1), lanes))
        for j in range(lanes):
            m.d.sync += pre[j].eq(Mux(rounds, round_shift(acc[j], self.fmt.frac_bits), acc[j]))
        s_out = self._control(m, "out_ctl", s_pre.valid, s_pre.op, s_pre.first, s_pre.last, s_pre.emit,
                              s_pre.lane)

        # ---- saturate / activation, F's packing of row elements into words ----------------------------
        rescaled = [saturate(pre[j], n) for j in range(lanes)]
        element = Signal(signed(n))  # F's finished row element
        m.d.comb += element.eq(Mux((s_out.op == Opcode.FWD_RELU) & (rescaled[0] < 0), 0, rescaled[0]))
        # F finishes one element per row; `packed` holds the elements of the word being filled. Lanes not
        # reached yet are 0, so a row count that is not a multiple of `lanes` leaves zero padding.
        packed = Signal(word_layout(lanes, self.fmt))
        fwd_word = Signal(word_layout(lanes, self.fmt))
        m.d.comb += fwd_word.eq(packed)
        for j in range(lanes):
            with m.If(s_out.lane == j):
                m.d.comb += fwd_word[j].eq(element)
        is_fwd_out = _is_fwd(s_out.op)
        with m.If(s_out.valid & s_out.last & is_fwd_out):
            m.d.sync += packed.eq(Mux(s_out.emit, 0, fwd_word))
        for j in range(lanes):
            m.d.sync += self.out_data[j].eq(Mux(is_fwd_out, fwd_word[j], rescaled[j]))
        m.d.sync += self.out_valid.eq(s_out.valid & s_out.emit)
        return m

    def _control(self, m: Module, name: str, valid: Value, op: Value, first: Value, last: Value, emit: Value,
                 lane: Value) -> data.View:
        """A beat's control: the inputs as they are (`d0`) or registered one stage down the pipeline."""
        layout = data.StructLayout({"valid": 1, "op": Opcode, "first": 1, "last": 1, "emit": 1,
                                    "lane": range(self.lanes)})
        stage = Signal(layout, name=name)
        domain = m.d.comb if name == "d0" else m.d.sync
        domain += [stage.valid.eq(valid), stage.op.eq(op), stage.first.eq(first), stage.last.eq(last),
                   stage.emit.eq(emit), stage.lane.eq(lane)]
        return stage


def _tree_level(terms: list[Value]) -> list[Value]:
    """One level of a balanced adder tree (pairs summed; an odd last term passes)."""
    paired = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
    return paired + ([terms[-1]] if len(terms) % 2 else [])


def _adder_tree(terms: list[Value]) -> Value:
    """Balanced sum (a log-depth tree rather than a chain, for timing)."""
    while len(terms) > 1:
        terms = _tree_level(terms)
    return terms[0]


def _is_fwd(op: Value) -> Value:
    return (op == Opcode.FWD_LINEAR) | (op == Opcode.FWD_RELU)
