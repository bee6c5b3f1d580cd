"""The arithmetic of the processing element: `lanes` multipliers, an adder tree, full-width accumulators,
rescale/saturate, the ReLU mask and U's subtract-with-shift — exactly `layerpipe.fixedpoint`'s rules.

The datapath is the back half of the PE pipeline. The PE's address generator issues one *beat* per cycle
(stage S0); the memories answer one cycle later (S1), which is where this component takes its inputs:

    S1  (comb)  lane products / elementwise results           → register `p`      (2·n-bit, signed)
    S2  (comb)  adder tree (F) and accumulate                  → register `acc`    (full width)
    S3  (comb)  rescale + saturate (+ ReLU, + F's word packing) → `out_data`, strobed by `out_valid`

so a beat's result leaves `LATENCY` = 2 cycles after its operands arrive. Every beat carries its own
control (op, first/last of an accumulation, the lane of a row element, the valid-lane mask), so
consecutive beats of different rows never need a bubble. Which operand means what, per op:

    FWD_*    p_j = W_j · X_j                       acc0 += Σ_j p_j        out lane `lane` = act(rescale(acc0))
    ERR      p_j = W_j · Y[lane]                   acc_j += p_j           out_j = rescale(acc_j)
    GRAD     p_j = Y[lane] · X_j                   acc_j  = p_j           out_j = rescale(acc_j)
    ACT_RELU p_j = X_j if Y_j > 0 else 0           acc_j  = p_j           out_j = acc_j
    OUT_ERR  p_j = sat(X_j − Y_j)                  acc_j  = p_j           out_j = acc_j
    UPD      p_j = sat(W_j − round_shift(G_j, k))  acc_j  = p_j           out_j = acc_j

Lanes outside the valid mask (the padding of a row's last word) produce 0, so padding stays zero.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from layerpipe.fixedpoint import FixedFormat

__all__ = ["LATENCY", "Datapath", "Opcode", "rescale", "round_shift", "saturate", "word_layout"]

#: Cycles from a beat's operands (S1) to its result (S3).
LATENCY = 2


class Opcode(enum.Enum, shape=3):
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
    """Clamp a signed value to the signed `width`-bit range (the result has exactly that shape)."""
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    value = value.as_signed()
    if len(value) <= width:
        return value  # already in range; the assignment sign-extends it
    clamped = Mux(value > hi, hi, Mux(value < lo, lo, value))
    return clamped[:width].as_signed()


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
    """Stages S1–S3 of the PE: see the module docstring. `acc_bits` is the accumulator width."""

    def __init__(self, lanes: int, fmt: FixedFormat, lr_shift: int, acc_bits: int) -> None:
        self.lanes = lanes
        self.fmt = fmt
        self.lr_shift = lr_shift
        self.acc_bits = acc_bits
        word = word_layout(lanes, fmt)
        super().__init__({
            # Control of the beat whose operands are on the inputs (stage S1).
            "valid": In(1),
            "op": In(Opcode),
            "first": In(1),  # start a new accumulation (acc ← addend instead of acc + addend)
            "last": In(1),  # the accumulation is complete after this beat (F: end of row)
            "emit": In(1),  # this beat writes a result word in S3
            "lane": In(range(lanes)),  # F: output lane of the row element; ERR/GRAD: lane of δ_i in Y
            "mask": In(lanes),  # valid lanes of the beat (padding lanes of a row's last word are 0)
            "x": In(word),
            "y": In(word),
            "w": In(word),
            "g": In(word),
            # Result (stage S3).
            "out_valid": Out(1),
            "out_data": Out(word),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        n, lanes = self.fmt.total_bits, self.lanes
        op = self.op

        # ---- S1: lane products and elementwise results -------------------------------------------------
        # One multiplier per lane, shared by F, E and G: the operands are muxed in front of it.
        scalar_y = Signal(signed(n))  # δ_i: lane `lane` of the Y word (the δ vector), broadcast to all lanes
        with m.Switch(self.lane):  # a lane mux (indexing the view by a Value would build a shifter)
            for j in range(lanes):
                with m.Case(j):
                    m.d.comb += scalar_y.eq(self.y[j])
        is_mac = _is_fwd(op) | (op == Opcode.ERR) | (op == Opcode.GRAD)
        p = Signal(data.ArrayLayout(signed(2 * n), lanes))
        for j in range(lanes):
            x, y, w, g = self.x[j], self.y[j], self.w[j], self.g[j]
            product = Mux((op == Opcode.ERR) | (op == Opcode.GRAD), scalar_y, x) * Mux(op == Opcode.GRAD, x, w)
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
            m.d.sync += p[j].eq(Mux(keep, Mux(is_mac, product, elementwise), 0))

        s2 = self._stage(m, "s2", self.valid, op, self.first, self.last, self.emit, self.lane)

        # ---- S2: adder tree (F) and accumulate -----------------------------------------------------
        acc = Signal(data.ArrayLayout(signed(self.acc_bits), lanes))
        tree = Signal(signed(self.acc_bits))
        m.d.comb += tree.eq(_adder_tree([p[j] for j in range(lanes)]))
        with m.If(s2.valid):
            for j in range(lanes):
                # F sums the lanes into lane 0; E accumulates per lane; the rest just pass p through (first=1).
                addend = Mux(_is_fwd(s2.op), tree if j == 0 else 0, p[j])
                m.d.sync += acc[j].eq(Mux(s2.first, 0, acc[j]) + addend)

        s3 = self._stage(m, "s3", s2.valid, s2.op, s2.first, s2.last, s2.emit, s2.lane)

        # ---- S3: rescale / saturate / activation, F's packing of row elements into words -------------
        rescaled = [rescale(acc[j], self.fmt) for j in range(lanes)]
        element = Signal(signed(n))  # F's finished row element
        m.d.comb += element.eq(Mux((s3.op == Opcode.FWD_RELU) & (rescaled[0] < 0), 0, rescaled[0]))
        # F finishes one element per row; `packed` holds the elements of the word being filled. Lanes not
        # reached yet are 0, so a row count that is not a multiple of `lanes` leaves zero padding.
        packed = Signal(word_layout(lanes, self.fmt))
        fwd_word = Signal(word_layout(lanes, self.fmt))
        m.d.comb += fwd_word.eq(packed)
        for j in range(lanes):
            with m.If(s3.lane == j):
                m.d.comb += fwd_word[j].eq(element)
        with m.If(s3.valid & s3.last & _is_fwd(s3.op)):
            m.d.sync += packed.eq(Mux(s3.emit, 0, fwd_word))

        s3_rescaled = (s3.op == Opcode.ERR) | (s3.op == Opcode.GRAD)
        for j in range(lanes):
            passthrough = acc[j][:n].as_signed()  # elementwise results are saturated already in S1
            result = Mux(_is_fwd(s3.op), fwd_word[j], Mux(s3_rescaled, rescaled[j], passthrough))
            m.d.comb += self.out_data[j].eq(result)
        m.d.comb += self.out_valid.eq(s3.valid & s3.emit)
        return m

    def _stage(self, m: Module, name: str, valid: Value, op: Value, first: Value, last: Value, emit: Value,
               lane: Value) -> data.View:
        """Register a beat's control one stage down the pipeline."""
        layout = data.StructLayout({"valid": 1, "op": Opcode, "first": 1, "last": 1, "emit": 1,
                                    "lane": range(self.lanes)})
        stage = Signal(layout, name=name)
        m.d.sync += [stage.valid.eq(valid), stage.op.eq(op), stage.first.eq(first), stage.last.eq(last),
                     stage.emit.eq(emit), stage.lane.eq(lane)]
        return stage


def _adder_tree(terms: list[Value]) -> Value:
    """Balanced sum (a log-depth tree rather than a chain, for timing)."""
    while len(terms) > 1:
        paired = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        terms = paired + ([terms[-1]] if len(terms) % 2 else [])
    return terms[0]


def _is_fwd(op: Value) -> Value:
    return (op == Opcode.FWD_LINEAR) | (op == Opcode.FWD_RELU)
