"""The PyTorch reference: independent checks of its float path (plain torch training) and its integer path
(a hand-worked step), its version semantics, its errors, and the RTL helper `expected_fixed_run`."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from test_functional import assert_weights_close, residual_mlp, small_cnn

from layerpipe.errors import InputError
from layerpipe.fixedpoint import DEFAULT_FORMAT
from layerpipe.network import Conv2d, Flatten, Linear, Network, NetworkBuilder, Pool2d, mlp
from layerpipe.numerics import Lags, init_weights, make_data, versions_from_lags
from layerpipe.reference import expected_fixed_run, train_reference
from layerpipe.sim.functional import FunctionalConfig, run_functional, sequential_ops


def torch_plain_sgd(network: Network, init: dict, data: dict, lr: float, iterations: int) -> dict[str, np.ndarray]:
    """Ordinary torch training: nn.Linear / nn.Conv2d / pooling modules, autograd, optim.SGD, a step per micro-batch."""
    torch.manual_seed(0)
    modules: dict[int, torch.nn.Module] = {}
    for layer in network.layers:
        op = layer.op
        if isinstance(op, Linear):
            m = torch.nn.Linear(layer.in_size, layer.out_size, bias=op.bias, dtype=torch.float64)
        elif isinstance(op, Conv2d):
            m = torch.nn.Conv2d(layer.in_shapes[0][0], op.out_channels, op.kernel_size, op.stride, op.padding,
                                groups=op.groups, bias=op.bias, dtype=torch.float64)
        elif isinstance(op, Pool2d):
            pool = torch.nn.MaxPool2d if op.mode == "max" else torch.nn.AvgPool2d
            modules[layer.index] = pool(op.kernel_size, op.effective_stride, op.padding)
            continue
        elif isinstance(op, Flatten):
            modules[layer.index] = torch.nn.Flatten()
            continue
        else:
            continue
        with torch.no_grad():
            m.weight.copy_(torch.as_tensor(init[f"W{layer.index}"]))
            if op.bias:
                m.bias.copy_(torch.as_tensor(init[f"b{layer.index}"]))
        modules[layer.index] = m
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = torch.optim.SGD(params, lr=lr)
    acts = {"relu": torch.relu, "identity": lambda z: z, "tanh": torch.tanh, "sigmoid": torch.sigmoid}
    b = network.batch
    for t in range(iterations):
        outs = {0: torch.as_tensor(data["x"][t * b:(t + 1) * b])}
        for layer in network.layers:
            ins = [outs[i] for i in layer.inputs]
            z = modules[layer.index](ins[0]) if layer.index in modules else sum(ins[1:], ins[0])
            outs[layer.index] = acts[layer.activation](z)
        loss = 0.5 * ((outs[len(network)] - torch.as_tensor(data["y"][t * b:(t + 1) * b])) ** 2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out = {}
    for index, m in modules.items():
        if isinstance(m, torch.nn.Linear | torch.nn.Conv2d):
            out[f"W{index}"] = m.weight.detach().numpy()
            if m.bias is not None:
                out[f"b{index}"] = m.bias.detach().numpy()
    return out


@pytest.mark.parametrize("network", [mlp([7, 6, 5, 3], batch=2), residual_mlp(batch=3, act="tanh"),
                                     small_cnn("max"), small_cnn("avg")], ids=["mlp", "resmlp", "cnn_max", "cnn_avg"])
def test_plain_sgd_equals_ordinary_torch_training(network: Network) -> None:
    iterations, lr = 15, 0.05
    init, data = init_weights(network, 3), make_data(network, iterations * network.batch, 3)
    want = torch_plain_sgd(network, init, data, lr, iterations)
    versions = versions_from_lags(network, Lags(), iterations)
    functional = run_functional(network, sequential_ops(network, iterations), versions, init, data,
                                FunctionalConfig(lr=lr))
    assert_weights_close(functional.weights, want, rtol=1e-12)
    reference = train_reference(network, init, data, Lags(), "stash", lr)
    assert_weights_close(reference.weights, want, rtol=1e-12)


@pytest.mark.parametrize("fixed", [False, True])
def test_lags_and_the_full_map_give_the_same_run(fixed: bool) -> None:
    network = residual_mlp()
    fmt = DEFAULT_FORMAT if fixed else None
    init, data = init_weights(network, 5, fmt), make_data(network, 9, 5)
    lags = Lags({1: 3, 2: 1}, {1: 2, 4: -1})
    a = train_reference(network, init, data, lags, "ema", 2.0**-3, fmt)
    b = train_reference(network, init, data, versions_from_lags(network, lags, 9), "ema", 2.0**-3, fmt)
    for key in a.weights:
        assert np.array_equal(a.weights[key], b.weights[key])
    assert np.array_equal(a.losses, b.losses)


def one_weight_network() -> Network:
    return NetworkBuilder("one", (1,)).add("fc", mlp([1, 1]).layers[0].op).build()


def test_integer_path_by_hand() -> None:
    # W = 1.0 (256), x = 0.5 (128), y = 0: z = (256·128 + 128) >> 8 = 128, e = 128,
    # g = (128·128 + 128) >> 8 = 64, update with η = 2^−2: W = 256 − ((64 + 2) >> 2) = 240.
    # Second sample, x = −0.5: z = (240·−128 + 128) >> 8 = −120 (−30592 floors to −120), e = −120,
    # g = (−120·−128 + 128) >> 8 = 60, W = 240 − ((60 + 2) >> 2) = 225.
    network = one_weight_network()
    data = {"x": np.array([[0.5], [-0.5]]), "y": np.zeros((2, 1))}
    init = {"W1": np.array([[256]], dtype=np.int64)}
    ref = train_reference(network, init, data, Lags(), "stash", 0.25, DEFAULT_FORMAT)
    assert ref.weights["W1"].tolist() == [[225]]
    assert ref.losses.tolist() == [0.5 * 0.5**2, 0.5 * (120 / 256) ** 2]
    versions = versions_from_lags(network, Lags(), 2)
    functional = run_functional(network, sequential_ops(network, 2), versions, init, data,
                                FunctionalConfig(lr=0.25, fmt=DEFAULT_FORMAT))
    assert functional.weights["W1"].tolist() == [[225]]


def test_reading_a_version_that_needs_a_later_iteration_is_an_input_error() -> None:
    network = mlp([3, 2, 2])
    init, data = init_weights(network, 0), make_data(network, 4, 0)
    versions = versions_from_lags(network, Lags(), 4)
    with pytest.raises(InputError, match=r"E2\.1 reads version 3 of layer 2, which needs the gradient of iteration 2"):
        train_reference(network, init, data, {**versions, ("E", 2, 1): 3}, "latest", 0.1)
    versions[("F", 1, 2)] = 3
    with pytest.raises(InputError, match=r"F1\.2 reads version 3 of layer 1"):
        train_reference(network, init, data, versions, "stash", 0.1)
    del versions[("F", 1, 2)]
    with pytest.raises(InputError, match=r"version map has no entry for F1\.2"):
        train_reference(network, init, data, versions, "stash", 0.1)


def test_reference_input_errors() -> None:
    network = mlp([3, 2])
    init, data = init_weights(network, 0), make_data(network, 2, 0)
    with pytest.raises(InputError, match="mode 'fresh' is not one of"):
        train_reference(network, init, data, Lags(), "fresh")
    with pytest.raises(InputError, match="lr must be a power of two"):
        train_reference(network, init, data, Lags(), "stash", 0.3, DEFAULT_FORMAT)
    with pytest.raises(InputError, match=r"data has 2 samples; 3 iterations"):
        train_reference(network, init, data, Lags(), iterations=3)
    with pytest.raises(InputError, match=r"lags.backward\[1\] must be an integer >= -1"):
        Lags({}, {1: -2})


def test_expected_fixed_run_is_what_the_functional_simulator_computes() -> None:
    network = mlp([4, 3, 2])
    lags = Lags({1: 2, 2: 0}, {2: 0})
    expected = expected_fixed_run(network, lags, 12, seed=7, fmt=DEFAULT_FORMAT, lr_shift=3)
    assert set(expected) == {"x", "y", "losses", "init_W1", "init_W2", "final_W1", "final_W2"}
    assert expected["x"].dtype == np.int64 and expected["x"].shape == (12, 4)
    init = init_weights(network, 7, DEFAULT_FORMAT)
    assert np.array_equal(expected["init_W1"], init["W1"])
    functional = run_functional(network, sequential_ops(network, 12), versions_from_lags(network, lags, 12), init,
                                make_data(network, 12, 7), FunctionalConfig(lr=2.0**-3, fmt=DEFAULT_FORMAT))
    assert np.array_equal(expected["final_W1"], functional.weights["W1"])
    assert np.array_equal(expected["final_W2"], functional.weights["W2"])
    assert not np.array_equal(expected["final_W1"], expected["init_W1"])


def test_core_numerics_import_and_run_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import layerpipe.reference, layerpipe.numerics as n\n"
        "from layerpipe.network import mlp\n"
        "from layerpipe.sim.functional import run_functional, sequential_ops\n"
        "net = mlp([3, 2]); v = n.versions_from_lags(net, n.Lags(), 2)\n"
        "r = run_functional(net, sequential_ops(net, 2), v, n.init_weights(net, 0), n.make_data(net, 2, 0))\n"
        "print(r.losses.shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(2,)"
