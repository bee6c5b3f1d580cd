"""dp and dp-ooo (OOO BackProp's reverse first-k, `layerpipe.schedule._dataparallel`) on the stream engine.

What the issue asks: with free communication the order does not matter (dp == dp-ooo for every K); when the
all-reduce of layer 1 is the critical path dp-ooo is faster by what the reordering hides (a case computed
by hand below); K = 0 is dp; both are plain synchronous mini-batch SGD (functional mode against the PyTorch
reference with every read at version ⌊t / N⌋); bad input is one line and exit 2.
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_functional import assert_weights_close, residual_mlp

from layerpipe._memo import clear_memos
from layerpipe.cli import main
from layerpipe.costs import make_cost_model
from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect, parse_interconnect
from layerpipe.network import Network, mlp
from layerpipe.numerics import init_weights, make_data
from layerpipe.reference import train_reference
from layerpipe.schedule._dataparallel import (
    DPOOOOptions,
    DPOptions,
    memo_step_cycles,
    plan,
    ring_allreduce_cycles,
    step_cycles,
    weight_layers,
)
from layerpipe.schedule.policies import make_schedule, policy_options
from layerpipe.sim import SimConfig, simulate_policy_result
from layerpipe.sim._streams import functional_order
from layerpipe.sim.functional import FunctionalConfig, run_functional
from tests.strategies import networks

MACS = make_cost_model("macs")


def period(policy: str, net: Network, n: int, interconnect: Interconnect, **options: object) -> int:
    return make_schedule(policy, net, n, MACS, policy_options(policy, options), interconnect).metrics.period_cycles


interconnects = st.one_of(
    st.just(SHARED),
    st.builds(Interconnect.links, st.integers(0, 40), st.sampled_from(["1", "3", "1/4"])),
    st.builds(Interconnect.bus, st.integers(0, 40), st.sampled_from(["2", "1/2"])),
)


@settings(max_examples=25, deadline=None)
@given(width=st.integers(1, 8), depth=st.integers(1, 5), n=st.integers(1, 5), batch=st.integers(1, 3),
       data=st.data())
def test_free_communication_makes_the_order_irrelevant(width: int, depth: int, n: int, batch: int, data) -> None:
    net = mlp([width] * (depth + 1), batch=batch)
    k = data.draw(st.integers(0, depth))
    dp = period("dp", net, n, SHARED)
    assert dp == period("dp-ooo", net, n, SHARED, reverse_first_k=k)
    # nothing waits: a step is one replica's work
    assert dp == sum(make_schedule("dp", net, n, MACS).graph.costs(MACS).values())  # type: ignore[union-attr]


@settings(max_examples=25, deadline=None)
@given(net=networks(max_layers=5, max_batch=2), n=st.integers(1, 4), ic=interconnects,
       bucket=st.sampled_from([0, 1, 40, 10**6]), priority=st.booleans())
def test_reverse_first_k_0_is_dp(net: Network, n: int, ic: Interconnect, bucket: int, priority: bool) -> None:
    if not weight_layers(net):
        return
    dp = make_schedule("dp", net, n, MACS, DPOptions(bucket, priority), ic)
    ooo = make_schedule("dp-ooo", net, n, MACS, DPOOOOptions(0, bucket, priority), ic)
    assert dp.metrics.row() == ooo.metrics.row()
    assert dp.metrics.lower_bound_cycles <= dp.metrics.cycles_per_sample  # compute and the busiest channel
    a = simulate_policy_result(dp, net, MACS, 3 * n, SimConfig.of(ic))
    b = simulate_policy_result(ooo, net, MACS, 3 * n, SimConfig.of(ic))
    assert a.ops == b.ops and a.start.tolist() == b.start.tolist() and a.end.tolist() == b.end.tolist()


@settings(max_examples=20, deadline=None)
@given(n_in=st.integers(1, 12), n_out=st.integers(1, 12), n=st.integers(2, 6), latency=st.integers(0, 50),
       w=st.sampled_from([1, 2, Fraction(1, 3)]))
def test_one_layer_step_is_its_work_plus_the_ring_formula(n_in: int, n_out: int, n: int, latency: int, w) -> None:
    """T_AR = 2(N−1)·(⌈⌈|W|/N⌉ / w⌉ + L) on links, and the update waits for it."""
    net = mlp([n_in, n_out])
    ic = Interconnect.links(latency, w)
    work = sum(make_schedule("dp", net, n, MACS).graph.costs(MACS).values())  # type: ignore[union-attr]
    chunk = -(-n_in * n_out // n)
    ring = 2 * (n - 1) * (-(-chunk * Fraction(w).denominator // Fraction(w).numerator) + latency)
    assert ring == ring_allreduce_cycles(n_in * n_out, n, ic)
    assert period("dp", net, n, ic) == work + ring
    # one medium: every ring step's N transfers queue on it, so the bus is never faster than the ring's links
    assert period("dp", net, n, Interconnect.bus(latency, w)) >= work + ring


def test_hand_computed_case_dp_ooo_hides_layer_2s_weight_gradient_behind_layer_1s_all_reduce() -> None:
    """mlp 4-16-2, batch 8, N = 2, links latency 100, 1 word/cycle; macs costs:
    F1 = 512, F2 = 256, A2 = 16, E2 = 256, G2 = 256, A1 = 128, G1 = 512, U1 = 64, U2 = 32.
    Ring all-reduce (N = 2: 2 steps of ⌈|W|/2⌉ words): T_AR1 = 2·(32 + 100) = 264, T_AR2 = 2·(16 + 100) = 232.

    dp: F1 F2 A2 E2 G2 A1 G1 → G1 ends at 1936; AR1 ends 2200; U2 runs 1936..1968 (AR2 ran 1296..1528), U1 waits
    for AR1 and ends at 2264. Period 2264 = compute without updates + T_AR1 + U1.
    dp-ooo K = 2: U1 F1 U2 F2 A2 E2 A1 G1 G2; counted from F1's start G1 ends at 512 + 32 + 256 + 16 + 256
    + 128 + 512 = 1712, AR1 ends at 1976, U1 runs 1976..2040 and F1 follows: period 2040. AR1's second
    step leaves at 1844, before G2 ends at 1968, so AR2 never
    delays it; AR2 ends at 2200, long before U2 is due (after the next F1, at 2552).
    Hidden: G2 (256) now overlaps AR1, and U2 (32) moved onto the forward: 2264 − 2040 = 256 − 32.
    """
    net = mlp([4, 16, 2], batch=8)
    ic = Interconnect.links(100, 1)
    costs = {(t.kind, t.layer): c for t, c in
             make_schedule("dp", net, 2, MACS).graph.costs(MACS).items()}  # type: ignore[union-attr]
    assert costs == {("F", 1): 512, ("A", 1): 128, ("G", 1): 512, ("U", 1): 64, ("F", 2): 256, ("A", 2): 16,
                     ("E", 2): 256, ("G", 2): 256, ("U", 2): 32}
    assert ring_allreduce_cycles(64, 2, ic) == 264
    dp = period("dp", net, 2, ic)
    assert dp == sum(costs.values()) - costs[("U", 1)] - costs[("U", 2)] + 264 + costs[("U", 1)] == 2264
    ooo = period("dp-ooo", net, 2, ic, reverse_first_k=2)
    assert ooo == 2040 == dp - (costs[("G", 2)] - costs[("U", 2)])
    assert period("dp-ooo", net, 2, ic, reverse_first_k=1) == dp  # K = 1 moves nothing: G1 is last anyway
    auto = make_schedule("dp-ooo", net, 2, MACS, DPOOOOptions(), ic)
    assert auto.options.reverse_first_k == 2 and auto.metrics.period_cycles == 2040  # type: ignore[attr-defined]


def test_buckets_close_at_their_size_and_reduce_as_one() -> None:
    """DDP-style buckets in backward order: with room for both layers (≥ 96 words) one all-reduce of 96
    words leaves after G1 (1936): T_AR = 2·(48 + 100) = 296, so U2 and U1 run 2232..2328. A bucket of 32
    words closes after layer 2 alone: the per-layer schedule (2264). Latency pipelines in this model, so
    merging all-reduces saves no per-message cost and only holds layer 2's back."""
    net = mlp([4, 16, 2], batch=8)
    ic = Interconnect.links(100, 1)
    assert period("dp", net, 2, ic, bucket_words=32) == period("dp", net, 2, ic) == 2264
    assert ring_allreduce_cycles(96, 2, ic) == 296
    assert period("dp", net, 2, ic, bucket_words=96) == 1936 + 296 + 32 + 64 == 2328
    ooo = make_schedule("dp-ooo", net, 2, MACS, DPOOOOptions(1, 96), ic)  # layer 1 alone, layer 2 its bucket
    assert ooo.metrics.period_cycles == 2264


def test_links_contention_is_timed() -> None:
    """At batch 4 layer 2's all-reduce takes the ring link while layer 1's is still on the ring (FIFO by
    ready time), and delays it. dp-ooo K = 2, from F1's start: F1 256, U2 32, F2 128, A2 8, E2 128, A1 64,
    G1 256 → G1 ends at 872; AR1's first step holds the link 872..904 and arrives at 1004. G2 ends at 1000 and
    AR2's first step holds the link 1000..1016, so AR1's second step leaves at 1016, not 1004: AR1 ends at
    1016 + 32 + 100 = 1148, U1 runs to 1212. Without the conflict: 872 + T_AR1 (264) + U1 (64) = 1200."""
    net = mlp([4, 16, 2], batch=4)
    ic = Interconnect.links(100, 1)
    without_conflict = 872 + ring_allreduce_cycles(64, 2, ic) + 64
    assert period("dp-ooo", net, 2, ic, reverse_first_k=2) == without_conflict + (1000 + 16 - 1004) == 1212


@pytest.mark.parametrize("policy,options", [("dp", {}), ("dp", {"bucket_words": 60}),
                                            ("dp-ooo", {"reverse_first_k": 2}), ("dp-ooo", {"reverse_first_k": 3})])
@pytest.mark.parametrize("name", ["mlp", "resmlp"])
def test_functional_mode_is_plain_minibatch_sgd(policy: str, options: dict, name: str) -> None:
    """The simulated order and the observed versions give the weights of plain mini-batch SGD on N·B samples."""
    net = mlp([6, 8, 8, 3], batch=2) if name == "mlp" else residual_mlp(batch=2)
    n, steps = 3, 3
    ic = Interconnect.links(7, 2)
    result = make_schedule(policy, net, n, MACS, policy_options(policy, options), ic)
    sim = simulate_policy_result(result, net, MACS, steps * n, SimConfig.of(ic, "latest"))
    plain = {(kind, layer, t): t // n for t in range(steps * n) for layer in weight_layers(net)
             for kind in "FE" if (kind, layer, t) in sim.index}
    assert sim.version_map == plain  # observed, not assumed: updates that ended before each read started
    data, init = make_data(net, steps * n * net.batch, 5), init_weights(net, 5)
    got = run_functional(net, functional_order(sim), sim.version_map, init, data,
                         FunctionalConfig("latest", 2.0**-3, synchronous=True, microbatches=n))
    want = train_reference(net, init, data, plain, "latest", 2.0**-3, synchronous=True, microbatches=n)
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-9, atol=1e-12)
    assert_weights_close(got.weights, want.weights)
    assert set(got.updates.values()) == {steps}


def test_bad_options_are_input_errors() -> None:
    net = mlp([4, 4, 4])
    with pytest.raises(InputError, match=r"--reverse-first-k must be an integer >= 0 or 'auto', got -1"):
        DPOOOOptions(-1)
    with pytest.raises(InputError, match=r"--reverse-first-k must be in 0\.\.2 \(the weight layers"):
        make_schedule("dp-ooo", net, 2, MACS, DPOOOOptions(3))
    with pytest.raises(InputError, match=r"--bucket-words must be an integer >= 0"):
        DPOptions(-5)
    with pytest.raises(InputError, match=r"comm_priority \(--comm-priority\) must be true or false, got 'yes'"):
        DPOOOOptions(2, 0, "yes")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"rtl cannot carry a data-parallel all-reduce"):
        make_schedule("dp", net, 2, MACS, None, Interconnect.rtl(4))


@pytest.mark.parametrize("argv,words", [
    (["--reverse-first-k", "-1", "--interconnect", "links:1:1"], ["--reverse-first-k", "must be >= 0"]),
    (["--reverse-first-k", "3", "--interconnect", "links:1:1"], ["--reverse-first-k must be in 0..2"]),
    (["--reverse-first-k", "two", "--interconnect", "links:1:1"], ["--reverse-first-k", "'two'"]),
    (["--interconnect", "rtl"], ["rtl cannot carry", "allowed: shared, links:L:W, bus:L:W"]),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv: list[str], words: list[str], capsys) -> None:
    assert main(["schedule", "mlp:4-4-4", "--policy", "dp-ooo", "-n", "2", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), captured.err


def test_compare_takes_the_options_and_names_the_interconnect(capsys) -> None:
    argv = ["compare", "mlp:4-16-2", "--batch", "8", "-n", "2", "--policies", "dp,dp-ooo", "--baseline", "dp",
            "--interconnect", "links:100:1", "--cost-model", "macs", "--format", "json"]
    assert main([*argv, "--reverse-first-k", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r for r in doc["rows"]}
    assert rows["dp"]["cycles_per_sample"] == round(2264 / 16, 1)
    assert rows["dp-ooo"]["cycles_per_sample"] == round(2040 / 16, 1)
    assert rows["dp-ooo"]["speedup_vs_baseline"] == round(2264 / 2040, 3)
    assert rows["dp"]["interconnect"] == "links:100:1"
    # 2(N − 1)·N chunks of ⌈|W|/N⌉ words per step, over N·B samples
    assert rows["dp"]["traffic_words_per_sample"] == round(2 * 1 * 2 * (32 + 16) / 16, 1)


def test_explore_sweeps_reverse_first_k_and_keeps_stream_policies_at_one_device() -> None:
    from layerpipe.dse._evaluate import evaluate_point
    from layerpipe.dse._sweep import SweepSpec

    spec = SweepSpec(("mlp:4-16-2",), (1, 2), ("dp", "dp-ooo", "stream-ooo"), interconnects=("links:100:1",),
                     reverse_first_k=("0", "2"), batch=8, cost_model="macs")
    points = spec.points()
    assert [(p.num_procs, p.policy, p.reverse_first_k) for p in points] == [
        (1, "dp", None), (1, "dp-ooo", "0"), (1, "dp-ooo", "2"), (1, "stream-ooo", None),
        (2, "dp", None), (2, "dp-ooo", "0"), (2, "dp-ooo", "2")]
    assert "reverse_first_k" not in points[0].point_id and "reverse_first_k=2" in points[2].point_id
    rows = [evaluate_point(p) for p in points[4:]]
    assert [r["cycles_per_sample"] for r in rows] == [2264 / 16, 2264 / 16, 2040 / 16]  # the hand-computed case
    with pytest.raises(InputError, match="sweep reverse_first_k takes integers >= 0 or 'auto'"):
        SweepSpec(("mlp:4-16-2",), (2,), ("dp-ooo",), reverse_first_k=("-1",))


def test_simulate_cli_runs_dp_ooo_on_the_stream_engine_with_plain_sgd_numerics(tmp_path) -> None:
    out = tmp_path / "sim"
    assert main(["simulate", "mlp:6-8-8-3", "--policy", "dp-ooo", "-n", "3", "--reverse-first-k", "2",
                 "--interconnect", "links:7:2", "--batch", "2", "--samples", "24", "--functional", "float64",
                 "--mode", "latest", "--lr", "0.125", "--seed", "4", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_procs"] == 3 and metrics["traffic_words"] > 0
    net = mlp([6, 8, 8, 3], batch=2)
    plain = {(kind, layer, t): t // 3 for t in range(12) for layer in (1, 2, 3) for kind in "FE"
             if not (kind == "E" and layer == 1)}
    data, init = make_data(net, 24, 4), init_weights(net, 4)
    want = train_reference(net, init, data, plain, "latest", 0.125, synchronous=True, microbatches=3)
    with np.load(out / "final.npz") as got:
        assert_weights_close(dict(got), want.weights)


def test_report_section_states_ours_next_to_the_papers_ranges(monkeypatch, tmp_path) -> None:
    """The section on small inputs (the report runs alexnet, resnet18 and the zoo): the speedups quoted are the
    rows', the paper's ranges are named, and two runs give the same text."""
    from layerpipe import report_ooo
    from layerpipe.costs import PEModel

    monkeypatch.setattr(report_ooo, "DP_NETWORKS", ("mlp:4-16-2",))
    monkeypatch.setattr(report_ooo, "DP_PROCS", (2, 4))
    monkeypatch.setattr(report_ooo, "DP_INTERCONNECTS", ("links:100:1", "bus:100:1"))
    monkeypatch.setattr(report_ooo, "STREAM_NETWORKS", ("mlp:6-8-8-3",))
    text, rows = report_ooo.ooo_section(PEModel(8, 4), tmp_path)
    first = (tmp_path / "ooo_speedup.png").read_bytes()
    assert text == report_ooo.ooo_section(PEModel(8, 4), tmp_path)[0]
    assert (tmp_path / "ooo_speedup.png").read_bytes() == first and "![OOO speedups](ooo_speedup.png)" in text
    assert "the paper: 1.10–1.27×" in text and "the paper: 1.03–1.58×" in text
    ooo = [r for r in rows if r["policy"] == "dp-ooo"]
    assert len(ooo) == 4 and all(r["speedup_vs_baseline"] >= 1.0 for r in ooo)  # auto K includes K = 0 (= dp)
    low, high = min(r["speedup_vs_baseline"] for r in ooo), max(r["speedup_vs_baseline"] for r in ooo)
    assert f"Ours: {low:.2f}–{high:.2f}×; the paper: 1.10–1.27×" in text
    assert {r["where"] for r in rows if r["part"] == "single-device"} == {"pe 8 lanes, overhead 4",
                                                                           "pe 5120 lanes, overhead 7000"}
    assert set(rows[0]) == set(report_ooo.COLUMNS)


@settings(max_examples=15, deadline=None)
@given(net=networks(max_layers=5, max_batch=2), n=st.integers(1, 3), ic=interconnects, data=st.data())
def test_generated_networks_train_as_sequential_minibatch_sgd(net: Network, n: int, ic: Interconnect,
                                                              data) -> None:
    """Any network, N, interconnect and K: the simulated dp-ooo order gives the weights of the sequential
    order of plain mini-batch SGD (`sequential_ops`, N micro-batches a step) in the same executor."""
    from layerpipe.dfg import GraphOptions
    from layerpipe.sim.functional import sequential_ops

    weights = weight_layers(net)
    if not weights:
        return
    k = data.draw(st.integers(0, len(weights)))
    result = make_schedule("dp-ooo", net, n, MACS, DPOOOOptions(k), ic)
    steps = 2
    sim = simulate_policy_result(result, net, MACS, steps * n, SimConfig.of(ic, "latest"))
    plain = {key: key[2] // n for key in sim.version_map}
    assert sim.version_map == plain
    init, batches = init_weights(net, 2), make_data(net, steps * n * net.batch, 2)
    cfg = FunctionalConfig("latest", 2.0**-4, synchronous=True, microbatches=n)
    got = run_functional(net, functional_order(sim), sim.version_map, init, batches, cfg)
    want = run_functional(net, sequential_ops(net, steps * n, GraphOptions(), True, n), plain, init, batches, cfg)
    assert_weights_close(got.weights, want.weights)


@settings(max_examples=25, deadline=None)
@given(net=networks(max_layers=5, max_width=10), num_procs=st.integers(1, 4),
       spec=st.sampled_from(("shared", "links:2:1", "bus:1:1/2")), k=st.integers(0, 5))
def test_remembered_step_cycles_are_the_simulated_ones(net: Network, num_procs: int, spec: str, k: int) -> None:
    """`memo_step_cycles` (which `dp` and `dp-ooo`'s choice of K share) gives `step_cycles` of the plan, on a first
    query and a repeated one, and `dp` gives the same metrics with the memo empty or filled by `dp-ooo`."""
    if not weight_layers(net):
        return
    k = min(k, len(weight_layers(net)))
    model, ic = make_cost_model("pe"), parse_interconnect(spec)
    fresh = step_cycles(plan(net, num_procs, model, k, 0), ic)
    clear_memos()
    assert memo_step_cycles(net, num_procs, model, k, 0, False, ic) == fresh
    assert memo_step_cycles(net, num_procs, model, k, 0, False, ic) == fresh
    clear_memos()
    alone = make_schedule("dp", net, num_procs, model, None, ic).metrics
    make_schedule("dp-ooo", net, num_procs, model, None, ic)
    clear_memos()
    make_schedule("dp-ooo", net, num_procs, model, None, ic)
    assert make_schedule("dp", net, num_procs, model, None, ic).metrics == alone
