"""A heavy layer split over PEs, as the hardware runs it: the parts' outputs concatenated where their consumer
reads them, the consumer's error handed back to each part as a slice.

The `layerpipe` policy's split variants (`layerpipe/network/_split.py`) turn layer l into parts l.0 … l.(k−1)
with the same input; their consumer c reads the parts as one concatenated operand, and c's E output
e = Wᵀδ is that concatenation's error, each part's A reading its own slice. In hardware:

- The concatenation is one region of bank 0 on F_c's PE (`cat`, named `a<first>-<last>`): part j's vector
  at word offset o_j = Σ_{i<j} ⌈r_i/lanes⌉, each part padded to whole words (its padding lanes are 0: F zeroes
  them). A part computed on that PE writes its slice in place (its `a<i>` is a *view* of the region); a part
  computed elsewhere arrives over its link into the same words (`a<i>@<q>`, a view written through one of
  bank 0's receiver write ports, `PEConfig.local_writes`).
- The consumer's W has the same padded column layout: S = Σ_j ⌈r_j/lanes⌉ words per row, zero columns at
  the parts' padding (`pad_columns`; the host loads it so, reads it back so). Zero columns stay zero: G's
  padding is δ·0, U subtracts 0. So F_c, E_c, G_c and U_c are plain commands of cols = S·lanes, and the `rtl`
  cost model charges them B·rows·S (`layerpipe/_rtl_costs.py`): the simulator times exactly what the hardware does.
- E_c writes the error region `e<first>-<last>` in the same layout; part j's error `e<i>` is a view of it (read
  in place by an A on that PE, or sent from there: a view's transfer is its ⌈r_j/lanes⌉ words).

- A split layer that has an E (not the first layer): part j's E writes its partial error e<i>_<j> = sat(W_jᵀ δ_j)
  of the producer i; they reach A_i's PE in distinct banks (bank 0 for a part computed there, one receive bank
  per other PE) at the same address (the compiler aligns their rings), and A_i's ACT_RELU reads them in the same
  beat and sums them at full width before saturating once (`x_sum`, `PEConfig.sum_banks`): the reference's
  sat(Σ_j e_j), in A's own cycles, so the `rtl` cost model's A is unchanged.

- Micro-batches: a slot of the concatenation holds the B samples one after another, each with all its parts
  side by side (S words per sample), so the consumer walks it as any B vectors. A view's slot is then B runs of
  ⌈r_j/lanes⌉ words, S apart: the PE takes its operands' per-sample strides from the command
  (`PEConfig.strided`) and a link sender jumps between runs on either end. (Vectors whose per-sample length the
  lanes do not divide are refused with B > 1 as for any transfer: their padded samples take more beats.)

Not in hardware (refused in one line): a split layer reading another split layer's parts, two parts' errors
landing in one bank (two parts on one PE other than A's), and a concatenation sent to another PE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerpipe.errors import InputError
from layerpipe.network import INPUT, Network

__all__ = ["SplitShapes", "pad_columns", "split_shapes"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SplitShapes:
    """Per layer l = 1..L (index l − 1): its inputs (0 = the network input), its padded columns (elements of
    the operand its F reads, padding included), and where each of its consumer's parts sits."""

    widths: tuple[int, ...]  #: n_0 (input) then out_l per layer
    inputs: tuple[tuple[int, ...], ...]
    cols: tuple[int, ...]
    consumer: tuple[int, ...]  #: the layer reading layer l's output (0: none, the output layer)
    #: per concatenating consumer c: ((part, word offset, words), ...)
    segments: dict[int, tuple[tuple[int, int, int], ...]]
    lanes: int
    #: every layer reading layer l's output: its consumer, or a split layer's parts (whose E outputs are
    #: partial errors of l, summed by A_l: `PEConfig.sum_banks`)
    consumers: tuple[tuple[int, ...], ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.inputs)

    def is_cat(self, layer: int) -> bool:
        return len(self.inputs[layer - 1]) > 1

    def input_value(self, layer: int) -> str:
        """The vector F_layer reads: x, a<i>, or the concatenation a<first>-<last>."""
        ins = self.inputs[layer - 1]
        if ins == (INPUT,):
            return "x"
        return f"a{ins[0]}" if len(ins) == 1 else f"a{ins[0]}-{ins[-1]}"

    def error_value(self, layer: int) -> str:
        """The vector E_layer writes: e<i>, the concatenation's error e<first>-<last>, or (a part of a split
        layer reading layer i) its partial error e<i>_<layer>."""
        ins = self.inputs[layer - 1]
        if len(ins) == 1 and ins[0] != INPUT and len(self.consumers[ins[0] - 1]) > 1:
            return f"e{ins[0]}_{layer}"
        return "e" + self.input_value(layer)[1:]

    def part_of(self, layer: int) -> tuple[int, int, int] | None:
        """(consumer, word offset, words) when `layer` is a part of a concatenation."""
        c = self.consumer[layer - 1]
        if c and self.is_cat(c):
            for part, offset, words in self.segments[c]:
                if part == layer:
                    return c, offset, words
        return None

    def region_words(self, consumer: int) -> int:
        return self.cols[consumer - 1] // self.lanes


def split_shapes(network: Network, lanes: int) -> SplitShapes:
    """The shapes of a chain MLP or of a split variant of one, or `InputError` naming what the hardware cannot run
    (the checks of `mlp_widths` on each layer come first, by the caller)."""
    layers = network.layers
    consumers: dict[int, list[int]] = {}
    for layer in layers:
        for i in layer.inputs:
            consumers.setdefault(i, []).append(layer.index)
    for layer in layers:  # the parts of a split layer share their inputs
        siblings = [other for other in layers if tuple(other.inputs) == tuple(layer.inputs)]
        if len(siblings) > 1 and len(layer.inputs) > 1:
            raise InputError(f"the policy splits layer '{layer.name.rsplit('.', 1)[0]}', which reads another split "
                             "layer's parts: the concatenation would have several readers and their errors a sum "
                             "of concatenations, which the RTL does not combine; use --no-split-layers")
    inputs, cols, consumer, readers = [], [], [], []
    segments: dict[int, tuple[tuple[int, int, int], ...]] = {}
    for layer in layers:
        ins = tuple(layer.inputs)
        if list(ins) != sorted(ins) or (len(ins) > 1 and list(ins) != list(range(ins[0], ins[-1] + 1))):
            raise InputError(f"the RTL runs chains of fully connected layers (a split layer's parts read as one "
                             f"concatenation); layer '{layer.name}' reads layers {list(ins)}")
        users = consumers.get(layer.index, [])
        if len({tuple(network.layer(u).inputs) for u in users}) > 1:
            raise InputError(f"the RTL runs chains of fully connected layers; layer '{layer.name}' feeds "
                             f"{len(users)} layers")
        if layer.index != len(network) and not users:
            raise InputError(f"the RTL runs chains of fully connected layers; layer '{layer.name}' feeds nothing")
        if len(ins) > 1:
            offset, segs = 0, []
            for i in ins:
                words = _ceil_div(network.layer(i).out_size, lanes)
                segs.append((i, offset, words))
                offset += words
            segments[layer.index] = tuple(segs)
            cols.append(offset * lanes)
        else:
            cols.append(layer.in_size)
        inputs.append(ins)
        consumer.append(users[0] if users else 0)
        readers.append(tuple(users))
    widths = (network.input_size, *(layer.out_size for layer in layers))
    return SplitShapes(widths, tuple(inputs), tuple(cols), tuple(consumer), segments, lanes, tuple(readers))


def pad_columns(matrix: np.ndarray | Sequence[Sequence[int]], segments: Sequence[tuple[int, int, int]],
                part_rows: Sequence[int], lanes: int) -> np.ndarray:
    """A consumer's W (rows × Σ r_j) in the padded column layout: part j's columns at element offset o_j·lanes,
    zeros in its padding."""
    w = np.asarray(matrix)
    out = np.zeros((w.shape[0], sum(words for _, _, words in segments) * lanes), dtype=w.dtype)
    col = 0
    for (_, offset, _), rows in zip(segments, part_rows, strict=True):
        out[:, offset * lanes:offset * lanes + rows] = w[:, col:col + rows]
        col += rows
    return out
