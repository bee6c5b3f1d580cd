"""Networks: layer ops and their shape rules, the builder's checks, the zoo, and `load_network`."""

from __future__ import annotations

import math

import pytest

from layerpipe.errors import InputError
from layerpipe.network import (
    INPUT,
    ZOO,
    Activation,
    Add,
    Conv2d,
    Flatten,
    Linear,
    Network,
    NetworkBuilder,
    Pool2d,
    load_network,
    mlp,
)

# ------------------------------------------------------------------------------------------------- ops


def test_linear_shapes_weights_macs() -> None:
    op = Linear(5, bias=True, activation="relu")
    assert op.out_shape([(7,)], "x") == (5,)
    assert op.weight_count([(7,)]) == 7 * 5 + 5
    assert op.macs([(7,)]) == 35
    with pytest.raises(InputError, match="flat input"):
        op.out_shape([(3, 4, 4)], "layer 'fc'")


def test_conv_shapes_weights_macs() -> None:
    op = Conv2d(8, 3, stride=2, padding=1, groups=2)
    # (9 + 2 - 3) // 2 + 1 = 5
    assert op.out_shape([(4, 9, 9)], "x") == (8, 5, 5)
    assert op.weight_count([(4, 9, 9)]) == 8 * 2 * 9
    assert op.macs([(4, 9, 9)]) == 5 * 5 * 8 * 2 * 9
    assert Conv2d(8, 3, bias=True).weight_count([(4, 9, 9)]) == 8 * 4 * 9 + 8
    with pytest.raises(InputError, match="groups=3 must divide"):
        Conv2d(8, 3, groups=3).out_shape([(4, 9, 9)], "x")
    with pytest.raises(InputError, match="does not fit"):
        Conv2d(8, 11).out_shape([(4, 9, 9)], "x")
    with pytest.raises(InputError, match=r"\(channels, height, width\)"):
        Conv2d(8, 3).out_shape([(16,)], "x")


def test_pool_flatten_activation_add() -> None:
    assert Pool2d("max", 2).out_shape([(3, 8, 8)], "x") == (3, 4, 4)
    assert Pool2d("max", 3, stride=2, padding=1).out_shape([(64, 112, 112)], "x") == (64, 56, 56)
    assert Pool2d("avg", 2).macs([(3, 8, 8)]) == 3 * 4 * 4 * 4
    assert Flatten().out_shape([(3, 4, 5)], "x") == (60,)
    assert Activation("tanh").out_shape([(3, 4, 5)], "x") == (3, 4, 5)
    assert Activation("tanh").macs([(3, 4, 5)]) == 60
    assert Add().out_shape([(6,), (6,), (6,)], "x") == (6,)
    assert Add().macs([(6,), (6,), (6,)]) == 12
    with pytest.raises(InputError, match="one shape"):
        Add().out_shape([(6,), (5,)], "x")
    with pytest.raises(InputError, match="at least two inputs"):
        Add().out_shape([(6,)], "x")


@pytest.mark.parametrize(("make", "field"), [
    (lambda: Linear(0), "linear.out_features"),
    (lambda: Linear(-4), "linear.out_features"),
    (lambda: Linear(True), "linear.out_features"),
    (lambda: Conv2d(0, 3), "conv2d.out_channels"),
    (lambda: Conv2d(4, 0), "conv2d.kernel_size"),
    (lambda: Conv2d(4, 3, stride=0), "conv2d.stride"),
    (lambda: Conv2d(4, 3, padding=-1), "conv2d.padding"),
    (lambda: Pool2d("max", 0), "pool.kernel_size"),
    (lambda: Pool2d("max", 2, stride=0), "pool.stride"),
])
def test_non_positive_sizes_are_rejected(make, field: str) -> None:
    with pytest.raises(InputError, match=rf"^{field} must be a"):
        make()


def test_bad_activation_and_pool_mode_list_the_allowed_values() -> None:
    with pytest.raises(InputError, match="'gelu' is not one of identity, relu, sigmoid, tanh"):
        Linear(3, activation="gelu")
    with pytest.raises(InputError, match="'gelu' is not one of"):
        Activation("gelu")
    with pytest.raises(InputError, match="'min' is not one of max, avg"):
        Pool2d("min", 2)


# --------------------------------------------------------------------------------------------- builder


def _residual() -> Network:
    b = NetworkBuilder("res", (4,), batch=2)
    b.add("a", Linear(4, activation="relu"))
    b.add("b", Linear(4))
    b.add("join", Add(activation="relu"), ["b", "input"])
    b.add("out", Linear(2))
    return b.build()


def test_builder_infers_shapes_and_wires_a_dag() -> None:
    net = _residual()
    assert [layer.index for layer in net.layers] == [1, 2, 3, 4]
    assert net.layer(3).inputs == (2, INPUT)
    assert net.layer(3).in_shapes == ((4,), (4,)) and net.layer(3).in_size == 8
    assert net.consumers(INPUT) == [1, 3] and net.consumers(2) == [3]
    assert not net.is_chain and mlp([3, 2]).is_chain
    assert net.layer(1).takes_network_input and not net.layer(3).takes_network_input
    assert net.index_of("join") == 3 and net.output_shape == (2,) and net.batch == 2
    assert net.total_weights == 16 + 16 + 8
    assert net.with_batch(5).batch == 5 and net.with_batch(5).layers == net.layers


@pytest.mark.parametrize(("build", "message"), [
    (lambda b: b.add("x", Linear(3)).add("x", Linear(3)), "layer name 'x' is used twice"),
    (lambda b: b.add("input", Linear(3)), "layer name 'input' is reserved for the network input"),
    (lambda b: b.add("x", Linear(3), ["nope"]), "input 'nope' is not an earlier layer or 'input'"),
    (lambda b: b.add("x", Linear(3), ["later"]).add("later", Linear(3)), "input 'later' is not an earlier"),
    (lambda b: b.add("x", Linear(3), []), "inputs must not be empty"),
    (lambda b: b.add("x", Linear(3)).add("y", Add(), ["x", "input"]), r"add inputs must have one shape"),
    (lambda b: b.add("x", Linear(4)).add("y", Flatten(), ["x", "input"]), "only add, linear, conv2d layers take"),
    (lambda b: b.add("bad name", Linear(3)), "must be letters, digits"),
    (lambda b: b.add("x", Conv2d(3, 3)), r"conv2d needs a \(channels, height, width\) input"),
    (lambda b: b.add("x", Linear(3)).add("y", Linear(3), ["input"]), "layers x feed nothing"),
    (lambda b: b, "has no layers"),
])
def test_builder_errors_name_the_layer_and_rule(build, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        build(NetworkBuilder("n", (4,))).build()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("shape", [(), (0,), (-1,), (3, 4), (1, 2, 3, 4), (2.5,)])
def test_builder_rejects_bad_input_shapes(shape) -> None:
    with pytest.raises(InputError, match="input_shape"):
        NetworkBuilder("n", shape)


@pytest.mark.parametrize("batch", [0, -1, True, 1.5])
def test_batch_must_be_a_positive_integer(batch) -> None:
    with pytest.raises(InputError, match="batch must be a positive integer"):
        NetworkBuilder("n", (3,), batch=batch).add("x", Linear(2)).build()


def test_index_of_unknown_layer() -> None:
    with pytest.raises(InputError, match="no layer named 'zz'"):
        _residual().index_of("zz")


# ------------------------------------------------------------------------------------------------- zoo


def test_mlp_follows_the_design_notes() -> None:
    net = load_network("mlp:7-6-5-3", batch=4)
    assert net.name == "mlp:7-6-5-3" and net.batch == 4 and net.is_chain
    assert [(layer.op.out_features, layer.activation, layer.op.bias) for layer in net.layers] == [
        (6, "relu", False), (5, "relu", False), (3, "identity", False)]
    assert [layer.weight_count for layer in net.layers] == [42, 30, 15]


@pytest.mark.parametrize(("name", "layers", "output", "adds"), [
    ("lenet5", 8, (10,), 0),
    ("alexnet", 12, (1000,), 0),
    ("vgg16", 13 + 5 + 1 + 3, (1000,), 0),
    ("resnet18", 1 + 1 + 16 + 3 + 8 + 3, (1000,), 8),
    ("resnet50", 1 + 1 + 48 + 4 + 16 + 3, (1000,), 16),
])
def test_zoo_structure(name: str, layers: int, output: tuple[int, ...], adds: int) -> None:
    net = load_network(name, batch=2)
    assert len(net) == layers and net.output_shape == output and net.batch == 2
    assert sum(layer.kind == "add" for layer in net.layers) == adds
    assert net.is_chain == (adds == 0)
    for layer in net.layers:
        if layer.kind == "add":
            assert len(layer.inputs) == 2 and layer.activation == "relu"
    assert set(ZOO) == {"lenet5", "alexnet", "vgg16", "resnet18", "resnet50"}


def test_resnet_shapes_at_stage_boundaries() -> None:
    net = load_network("resnet50")
    shape = {layer.name: layer.out_shape for layer in net.layers}
    assert shape["pool1"] == (64, 56, 56)
    assert shape["layer1.2.add"] == (256, 56, 56)
    assert shape["layer2.0.downsample"] == (512, 28, 28)
    assert shape["layer4.2.add"] == (2048, 7, 7)
    assert shape["avgpool"] == (2048, 1, 1)
    assert math.prod(shape["flatten"]) == 2048


@pytest.mark.parametrize(("spec", "message"), [
    ("nonet", "unknown network 'nonet'; allowed: lenet5, alexnet, vgg16, resnet18, resnet50, mlp:W0-W1-..."),
    ("mlp:7", "at least two widths"),
    ("mlp:7-0-3", "positive integers"),
    ("mlp:7-x", "mlp widths must be integers like mlp:784-256-10"),
    ("mlp:", "mlp widths must be integers"),
])
def test_load_network_errors(spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        load_network(spec)
