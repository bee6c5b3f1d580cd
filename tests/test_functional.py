"""Functional mode against the PyTorch reference: float64 to 1e-9 relative, fixed point bit for bit.

Version maps here are hand-made (per-layer lags, including LayerPipe's 2·S(l)) and the op order is plain
sequential training (`sequential_ops`); `test_functional_e2e.py` covers simulated schedules.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import networks

from layerpipe.dfg import GraphOptions
from layerpipe.errors import InputError
from layerpipe.fixedpoint import DEFAULT_FORMAT, FixedFormat
from layerpipe.network import Activation, Add, Conv2d, Flatten, Linear, Network, NetworkBuilder, Pool2d, lenet5, mlp
from layerpipe.numerics import Lags, init_weights, make_data, versions_from_lags
from layerpipe.reference import train_reference
from layerpipe.schedule import Op
from layerpipe.sim.functional import FunctionalConfig, order_by_start, run_functional, sequential_ops

MODES = ("stash", "latest", "ema")


def residual_mlp(batch: int = 1, bias: bool = True, act: str = "relu") -> Network:
    """input 6 → fc1 → fc2 → add(fc2, fc1) → fc3 → 3: a DAG whose fc1 output has two consumers."""
    b = NetworkBuilder("resmlp", (6,), batch)
    b.add("fc1", Linear(5, bias=bias, activation=act), ["input"])
    b.add("fc2", Linear(5, bias=bias, activation="identity"), ["fc1"])
    b.add("join", Add(activation=act), ["fc2", "fc1"])
    b.add("fc3", Linear(3, bias=bias), ["join"])
    return b.build()


def image_mlp() -> Network:
    """A 3-D input through flatten and standalone activations (weightless layers with E tasks)."""
    b = NetworkBuilder("imgmlp", (2, 2, 2), 2)
    b.add("flat", Flatten(), ["input"])
    b.add("fc1", Linear(4), ["flat"])
    b.add("act", Activation("tanh"), ["fc1"])
    b.add("fc2", Linear(3, bias=True), ["act"])
    b.add("out", Activation("sigmoid"), ["fc2"])
    return b.build()


def small_cnn(pool: str = "max") -> Network:
    """Grouped, strided, padded conv with bias, a padded overlapping pool, a second conv, flatten, linear."""
    b = NetworkBuilder(f"cnn-{pool}", (2, 9, 9), 2)
    b.add("c1", Conv2d(4, 3, stride=2, padding=1, groups=2, bias=True, activation="relu"))
    b.add("p1", Pool2d(pool, 3, stride=2, padding=1))
    b.add("c2", Conv2d(3, 2, activation="relu"))
    b.add("flat", Flatten())
    b.add("fc", Linear(3, bias=True))
    return b.build()


def assert_weights_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float = 1e-9) -> None:
    assert got.keys() == want.keys()
    for key in want:
        scale = max(float(np.max(np.abs(want[key]))), 1e-300)
        err = float(np.max(np.abs(got[key] - want[key])))
        assert err <= rtol * scale, f"{key}: max error {err:.3e} vs scale {scale:.3e}"


def assert_weights_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == np.int64 and want[key].dtype == np.int64
        assert np.array_equal(got[key], want[key]), f"{key} differs"


def stage_lags(network: Network, stages: list[int]) -> Lags:
    """LayerPipe's delays: F_l reads 2·S(l) versions back, S(l) = stages after layer l's; E reads S(l) back."""
    last = max(stages)
    forward = {layer.index: 2 * (last - s) for layer, s in zip(network.layers, stages, strict=True)}
    backward = {layer.index: last - s for layer, s in zip(network.layers, stages, strict=True)}
    return Lags(forward, backward)


def run_both(network: Network, lags: Lags, iterations: int, mode: str, fmt: FixedFormat | None = None,
             synchronous: bool = False, microbatches: int = 1, options: GraphOptions | None = None, seed: int = 0,
             lr: float = 2.0**-3):
    data = make_data(network, iterations * network.batch, seed)
    init = init_weights(network, seed, fmt)
    versions = versions_from_lags(network, lags, iterations, synchronous, microbatches)
    ops = sequential_ops(network, iterations, options, synchronous, microbatches)
    config = FunctionalConfig(mode=mode, lr=lr, fmt=fmt, synchronous=synchronous, microbatches=microbatches)
    got = run_functional(network, ops, versions, init, data, config)
    want = train_reference(network, init, data, versions, mode, lr, fmt, synchronous, microbatches)
    return got, want


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("name", "network", "stages"),
    [("mlp", mlp([7, 6, 5, 3]), [0, 1, 2]), ("resmlp", residual_mlp(), [0, 0, 1, 2]),
     ("resmlp_b2", residual_mlp(batch=2, act="tanh"), [0, 1, 1, 2]), ("imgmlp", image_mlp(), [0, 0, 1, 1, 2]),
     ("cnn_max", small_cnn("max"), [0, 0, 1, 1, 2]), ("cnn_avg", small_cnn("avg"), [0, 1, 1, 2, 2])],
)
def test_float64_matches_reference_with_layerpipe_lags(name: str, network: Network, stages: list[int],
                                                        mode: str) -> None:
    got, want = run_both(network, stage_lags(network, stages), 12, mode)
    assert_weights_close(got.weights, want.weights)
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-9, atol=1e-12)
    # The run actually trained: every layer moved away from its initial weights.
    init = init_weights(network, 0)
    assert all(not np.allclose(got.weights[k], init[k]) for k in init)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("network", [mlp([7, 6, 5, 3]), residual_mlp(bias=True), small_cnn("max"), small_cnn("avg")],
                         ids=["mlp", "resmlp", "cnn_max", "cnn_avg"])
def test_fixed_point_matches_integer_reference_bit_for_bit(network: Network, mode: str) -> None:
    lags = Lags({1: 4, 2: 2, 3: 1, 4: 0, 5: 0}, {1: 0, 2: 1, 3: 0, 4: -1, 5: -1})
    got, want = run_both(network, lags, 16, mode, fmt=DEFAULT_FORMAT, lr=2.0**-2)
    assert_weights_equal(got.weights, want.weights)
    assert np.array_equal(got.losses, want.losses)
    assert any(not np.array_equal(got.weights[k], v) for k, v in init_weights(network, 0, DEFAULT_FORMAT).items())


@pytest.mark.parametrize("fmt", [FixedFormat(12, 6), FixedFormat(24, 12)], ids=str)
def test_other_fixed_formats_match_integer_reference(fmt: FixedFormat) -> None:
    got, want = run_both(residual_mlp(batch=2), Lags({1: 2}, {1: 1}), 8, "latest", fmt=fmt, lr=2.0**-1)
    assert_weights_equal(got.weights, want.weights)


@pytest.mark.parametrize("fmt", [None, DEFAULT_FORMAT], ids=["float64", "fixed"])
@pytest.mark.parametrize("mode", MODES)
def test_synchronous_steps_sum_their_gradients(mode: str, fmt: FixedFormat | None) -> None:
    # 10 micro-batches in steps of 4: the last step is partial.
    network = residual_mlp(batch=2, bias=True)
    got, want = run_both(network, Lags(), 10, mode, fmt, synchronous=True, microbatches=4)
    assert got.updates == {1: 3, 2: 3, 4: 3}
    if fmt is None:
        assert_weights_close(got.weights, want.weights)
    else:
        assert_weights_equal(got.weights, want.weights)
    # A synchronous step is not m asynchronous updates: the two runs differ.
    async_got, _ = run_both(network, Lags(), 10, mode, fmt)
    assert not np.array_equal(async_got.weights["W1"], got.weights["W1"])


@pytest.mark.parametrize("fmt", [None, DEFAULT_FORMAT], ids=["float64", "fixed"])
def test_an_add_reading_one_layer_twice_sends_it_two_errors(fmt: FixedFormat | None) -> None:
    b = NetworkBuilder("twice", (4,))
    b.add("fc1", Linear(3, activation="relu"), ["input"])
    b.add("double", Add(), ["fc1", "fc1"])
    b.add("fc2", Linear(2), ["double"])
    got, want = run_both(b.build(), Lags({1: 2}, {1: 1}), 8, "latest", fmt)
    (assert_weights_close if fmt is None else assert_weights_equal)(got.weights, want.weights)


@pytest.mark.parametrize(("intra", "inter"), [(True, False), (False, True), (False, False)])
def test_fused_backward_kinds_compute_what_separate_tasks_compute(intra: bool, inter: bool) -> None:
    network = residual_mlp()
    lags = Lags({1: 3, 2: 2, 4: 0}, {1: 1, 2: 1, 4: 0})
    fused, want = run_both(network, lags, 10, "latest", options=GraphOptions(intra=intra, inter=inter))
    kinds = {op.kind for op in sequential_ops(network, 1, GraphOptions(intra=intra, inter=inter))}
    assert kinds & {"AE", "EG", "AG", "AEG"}
    assert_weights_close(fused.weights, want.weights)
    fused_fixed, want_fixed = run_both(network, lags, 10, "ema", fmt=DEFAULT_FORMAT,
                                       options=GraphOptions(intra=intra, inter=inter))
    assert_weights_equal(fused_fixed.weights, want_fixed.weights)


def test_plain_sgd_modes_agree_and_backward_reading_its_own_update_differs() -> None:
    network = mlp([5, 4, 3])
    plain = {mode: run_both(network, Lags(), 8, mode)[0].weights["W1"] for mode in MODES}
    assert np.array_equal(plain["stash"], plain["latest"]) and np.array_equal(plain["stash"], plain["ema"])
    after_update, want = run_both(network, Lags({}, {2: -1}), 8, "latest")
    assert_weights_close(after_update.weights, want.weights)
    assert not np.allclose(after_update.weights["W1"], plain["stash"])


def test_ema_error_is_zero_without_staleness_and_small_with_it() -> None:
    network = mlp([7, 6, 5, 3])
    same, _ = run_both(network, Lags({1: 2, 2: 1}, {1: 2, 2: 1}), 12, "ema")
    assert same.ema_error and same.ema_error_max == 0.0
    stale, _ = run_both(network, stage_lags(network, [0, 1, 2]), 12, "ema")
    stash, _ = run_both(network, stage_lags(network, [0, 1, 2]), 12, "stash")
    latest, _ = run_both(network, stage_lags(network, [0, 1, 2]), 12, "latest")
    assert 0.0 < stale.ema_error_max < 0.5
    # The correction helps on average: the reconstruction is nearer the stashed weights than W^(c) itself.
    assert np.mean(stale.ema_error) < np.mean(stale.stale_error)
    # The reconstruction lands closer to the stashed run than reading the latest weights does.
    assert np.linalg.norm(stale.weights["W2"] - stash.weights["W2"]) < np.linalg.norm(
        latest.weights["W2"] - stash.weights["W2"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), network=networks(max_layers=5, max_width=6, max_batch=2),
       mode=st.sampled_from(MODES), fixed=st.booleans())
def test_random_networks_and_lags_match_reference(data: st.DataObject, network: Network, mode: str,
                                                  fixed: bool) -> None:
    weighted = [layer.index for layer in network.layers if layer.has_weights]
    forward = {l: data.draw(st.integers(0, 3), label=f"lag_F{l}") for l in weighted}
    backward = {l: data.draw(st.integers(-1, 3), label=f"lag_E{l}") for l in weighted}
    fmt = DEFAULT_FORMAT if fixed else None
    microbatches = data.draw(st.integers(0, 3), label="microbatches (0: asynchronous)")
    got, want = run_both(network, Lags(forward, backward), 6, mode, fmt, synchronous=microbatches > 0,
                         microbatches=max(microbatches, 1), seed=data.draw(st.integers(0, 99)))
    if fixed:
        assert_weights_equal(got.weights, want.weights)
    else:
        assert_weights_close(got.weights, want.weights)


# -- order, versions and input errors ----------------------------------------------------------------------


def test_order_by_start_puts_producers_first_among_ties() -> None:
    # Start ties: the zero-cycle flatten F2.0 (p1) feeds F3.0 (p0), which starts when it starts and ends.
    ops = [(Op(0, "F", 3, 0), 5, 9), (Op(1, "F", 2, 0), 5, 5), (Op(0, "F", 1, 0), 0, 5), (Op(2, "G", 1, 1), 5, 9),
           (Op(1, "A", 3, 0), 9, 11), (Op(0, "E", 3, 0), 11, 14), (Op(1, "G", 3, 0), 11, 14)]
    assert [str(op) for op in order_by_start(ops)] == ["F1.0", "F2.0", "F3.0", "G1.1", "A3.0", "E3.0", "G3.0"]
    # Without end times the dataflow rank alone orders the zero-cycle producer first.
    starts_only = [(op, start) for op, start, _ in ops]
    assert [str(op) for op in order_by_start(starts_only)][:3] == ["F1.0", "F2.0", "F3.0"]
    # Independent ops that start together go by processor, then by the order given.
    same = [(Op(1, "F", 1, 0), 0), (Op(0, "F", 1, 0), 0), (Op(0, "F", 1, 0), 0)]
    assert [op.proc for op in order_by_start(same)] == [0, 0, 1]


def _tiny() -> tuple[Network, dict, dict]:
    network = mlp([3, 2, 2])
    return network, init_weights(network, 1), make_data(network, 4, 1)


def test_reading_an_unwritten_version_names_the_op() -> None:
    network, init, data = _tiny()
    versions = versions_from_lags(network, Lags(), 4)
    versions[("F", 2, 1)] = 3
    with pytest.raises(InputError, match=r"F2\.1 reads version 3 of layer 2, but 1 updates have been applied"):
        run_functional(network, sequential_ops(network, 4), versions, init, data)


def test_order_that_breaks_a_dependency_is_reported() -> None:
    network, init, data = _tiny()
    ops = sequential_ops(network, 2)
    g = next(op for op in ops if op.kind == "G" and op.unit == 2)
    ops.remove(g)
    ops.insert(0, g)
    with pytest.raises(InputError, match=r"G2\.0 ran before δ of layer 2, iteration 0 existed"):
        run_functional(network, ops, versions_from_lags(network, Lags(), 2), init, data)


def test_updates_out_of_order_are_rejected() -> None:
    network, init, data = _tiny()
    ops = [op for op in sequential_ops(network, 2) if not (op.kind == "U" and op.iteration == 0)]
    lags = Lags({1: 1, 2: 1}, {1: 1, 2: 1})  # nothing reads version 1, so the missing update shows at U(1)
    with pytest.raises(InputError, match=r"U2\.1 is update 1 of layer 2, but 0 updates have been applied"):
        run_functional(network, ops, versions_from_lags(network, lags, 2), init, data)


def test_lenet5_trains_bit_exact_in_fixed_point() -> None:
    network = lenet5()
    lags = Lags({1: 4, 3: 3, 6: 2, 7: 1}, {3: 1, 6: 1, 7: 0})
    got, want = run_both(network, lags, 3, "ema", fmt=DEFAULT_FORMAT, lr=2.0**-4)
    assert_weights_equal(got.weights, want.weights)


def test_fixed_point_refuses_sigmoid_and_tanh() -> None:
    with pytest.raises(InputError, match="fixed-point mode supports activations identity, relu; got tanh"):
        run_functional(image_mlp(), [], {}, {}, {"x": np.zeros((1, 1)), "y": np.zeros((1, 1))},
                       FunctionalConfig(fmt=DEFAULT_FORMAT))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"mode": "newest"}, "mode 'newest' is not one of stash, latest, ema"),
     ({"fmt": DEFAULT_FORMAT, "lr": 0.1}, "lr must be a power of two"),
     ({"lr": -1.0}, "lr must be a positive finite number"),
     ({"ema_shift": 99}, "ema_shift must be an integer in 0..61"),
     ({"synchronous": True, "microbatches": 0}, "microbatches must be a positive integer")],
)
def test_bad_config_is_an_input_error(kwargs: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        FunctionalConfig(**kwargs)


def test_too_little_data_is_an_input_error() -> None:
    network, init, data = _tiny()
    with pytest.raises(InputError, match="data 'x' has 4 samples; 6 iterations of batch 1 need 6"):
        run_functional(network, sequential_ops(network, 6), versions_from_lags(network, Lags(), 6), init, data)
