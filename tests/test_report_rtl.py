"""The report's RTL section on its own (issue 11, Build 5): LayerPipe with split placements, LayerPipe with
weights together and PipeDream on the same hardware, each verified in Icarus, next to the model's prediction on
the `rtl` interconnect; the RTL-measured speedups equal the model's."""

from __future__ import annotations

import pytest

pytest.importorskip("cocotb_tools.runner")
pytest.importorskip("torch")

from layerpipe.report import (
    RTL_POINTS,
    RTL_VARIANTS,
    RTLPoint,
    rtl_model_cycles_per_sample,
    rtl_results,
    rtl_section,
    rtl_speedups,
)


def test_report_points_are_where_splitting_pays() -> None:
    """At least two design points, and on each the model has the split placement faster than weights together
    and than PipeDream (the reason these points are in the report)."""
    assert len(RTL_POINTS) >= 2
    for point in RTL_POINTS:
        assert point.num_pes <= 4 and point.lanes <= 4
        split = rtl_model_cycles_per_sample(point, "layerpipe", False)
        together = rtl_model_cycles_per_sample(point, "layerpipe", True)
        pipedream = rtl_model_cycles_per_sample(point, "pipedream", True)
        assert split < together <= pipedream, (point, split, together, pipedream)


@pytest.mark.slow
def test_rtl_section_measures_the_models_speedup() -> None:
    """Two small points, no synthesis: every run bit-exact and cycle-exact, the steady state measured in RTL
    (the slowest PE's gap between issues) equals the schedule's period, and the RTL speedups (split vs
    PipeDream, together vs PipeDream) equal the model's; the section names both columns."""
    points = (RTLPoint("mlp:24-16-8", 2, 4, 12), RTLPoint("mlp:8-8-8-4", 3, 2, 12))
    doc = rtl_results(None, points, area=False)
    assert len(doc["points"]) == len(points) * len(RTL_VARIANTS)
    for d in doc["points"]:
        assert d["bit_exact"] and d["cycle_exact"], d
        assert d["period_rtl"] == d["period_sim"] and d["period_rtl_min"] <= d["period_rtl"], d
        assert d["steady_cycles_per_sample_rtl"] == d["model_cycles_per_sample"], d
    speedups = rtl_speedups(doc)
    assert all(s["equal"] for s in speedups)
    assert all(s["rtl"] > 1 for s in speedups if s["variant"] == "layerpipe")
    text = rtl_section(doc)
    assert "RTL speedup vs pipedream" in text and "model speedup vs pipedream" in text
    assert "equal the model's prediction" in text and "mlp:8-8-8-4 N=3 lanes=2" in text
