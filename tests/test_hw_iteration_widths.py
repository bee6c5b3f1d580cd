"""`iteration_sum_shape`: the signed shape the sequencer's wait thresholds (t − delay) and the links' weight-copy
slots (t + offset) are computed in must hold every value they take, and stay `signed(iteration_bits + 2)`
where that already does (the Verilog of every design that fit is unchanged)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from layerpipe.hdl._datapath import iteration_sum_shape


@given(bits=st.integers(1, 8), low=st.integers(-300, 0), high=st.integers(0, 300))
def test_every_sum_fits_and_the_old_width_is_kept(bits: int, low: int, high: int) -> None:
    def holds(width: int) -> bool:  # every t + k, t in [0, 2^bits), k in [low, high], in signed(width)
        return -(1 << (width - 1)) <= min(0, low) and (1 << bits) - 1 + max(0, high) <= (1 << (width - 1)) - 1

    shape = iteration_sum_shape(bits, low, high)
    assert shape.signed and holds(shape.width)
    old = bits + 2
    if holds(old):
        assert shape.width == old
    else:
        assert shape.width > old and not holds(shape.width - 1)  # no wider than needed


def test_the_widths_that_wrapped() -> None:
    assert iteration_sum_shape(1, -5, -5).width == 4  # t − 5 at T = 1 wrapped to +3 in signed(3)
    assert iteration_sum_shape(1, -4, 0).width == 3  # −4 fits: unchanged
