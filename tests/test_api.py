"""The public face (issue 13): `import layerpipe` names what a script needs, stays cheap, and the project
has one registry per concept and one parser per kind of option value."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerpipe.commands._common import COST_MODEL_OPTIONS, positive_float
from layerpipe.costs import COST_MODELS, make_cost_model
from layerpipe.errors import InputError


def test_one_cost_model_registry_feeds_the_cli_the_sweeps_and_the_errors() -> None:
    from layerpipe.dse._sweep import SWEEP_COST_MODELS

    assert list(COST_MODELS) == ["macs", "pe", "profiled", "rtl"]
    assert list(COST_MODEL_OPTIONS) == list(COST_MODELS)
    assert COST_MODEL_OPTIONS["pe"] == ("--lanes", "--overhead")
    assert SWEEP_COST_MODELS == ("macs", "pe", "rtl")  # every model without a profile file
    with pytest.raises(InputError, match="unknown cost model 'gpu'; allowed: macs, pe, profiled, rtl"):
        make_cost_model("gpu")
    assert make_cost_model("pe", lanes=8, overhead=2).atomic_cost.__self__.lanes == 8  # type: ignore[attr-defined]


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_positive_float_takes_finite_positive_numbers_only(value: float) -> None:
    parse = positive_float("--lr")
    if value > 0 and math.isfinite(value):
        assert parse(repr(value)) == value
        return
    with pytest.raises(argparse.ArgumentTypeError, match="--lr must be a finite number > 0") as info:
        parse(repr(value))
    assert isinstance(info.value, InputError)  # outside argparse it is the project's one-line error


def test_positive_float_names_the_field_on_text() -> None:
    with pytest.raises(InputError, match="--time-limit must be a number > 0 such as 0.0625 or 2e-4, got 'soon'"):
        positive_float("--time-limit")("soon")
