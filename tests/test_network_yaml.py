"""The YAML network format: loading, validation messages, duplicate keys, and exact round trips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.cli import main
from layerpipe.errors import InputError
from layerpipe.network import (
    ZOO,
    Conv2d,
    NetworkBuilder,
    Pool2d,
    dump_yaml,
    load_network,
    load_yaml_network,
    parse_yaml_network,
)
from tests.strategies import networks

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

HEAD = "version: 1\nname: t\ninput_shape: [4]\nlayers:\n"


def test_example_file_is_a_residual_dag() -> None:
    net = load_network(str(EXAMPLES / "residual_mlp.yaml"))
    assert net.name == "residual_mlp" and not net.is_chain
    assert [layer.kind for layer in net.layers] == ["linear"] * 3 + ["add"] + ["linear"] * 2 + ["add", "linear"]
    join = net.layer(net.index_of("block1.add"))
    assert [net.layer(i).name for i in join.inputs] == ["block1.fc2", "stem"] and join.activation == "relu"
    assert net.output_shape == (10,)


def test_every_field_of_every_type_is_read() -> None:
    text = """\
version: 1
name: all-types
input_shape: [3, 16, 16]
batch: 3
layers:
  - {name: c, type: conv2d, out_channels: 4, kernel_size: 3, stride: 1, padding: 1, groups: 1, bias: true,
     activation: tanh}
  - {name: m, type: maxpool, kernel_size: 2}
  - {name: a, type: avgpool, kernel_size: 3, stride: 1, padding: 1}
  - {name: s, type: sigmoid}
  - {name: r, type: relu}
  - {name: i, type: identity}
  - {name: t, type: tanh}
  - {name: sum, type: add, inputs: [t, m], activation: sigmoid}
  - {name: f, type: flatten}
  - {name: l, type: linear, out_features: 5, bias: false, activation: relu}
"""
    net = parse_yaml_network(text)
    ops = {layer.name: layer.op for layer in net.layers}
    assert net.batch == 3 and net.input_shape == (3, 16, 16)
    assert ops["c"] == Conv2d(4, 3, padding=1, bias=True, activation="tanh")
    assert ops["m"] == Pool2d("max", 2) and ops["a"] == Pool2d("avg", 3, stride=1, padding=1)
    assert [ops[k].function for k in "srit"] == ["sigmoid", "relu", "identity", "tanh"]
    assert net.layer(net.index_of("l")).in_shapes == ((4 * 8 * 8,),)
    assert parse_yaml_network(text, batch=7).batch == 7  # the caller's batch wins


@pytest.mark.parametrize("name", ["mlp:7-6-5-3", *ZOO])
def test_zoo_networks_round_trip_exactly(name: str) -> None:
    net = load_network(name, batch=5)
    text = dump_yaml(net)
    again = parse_yaml_network(text)
    assert again == net and again.name == net.name and again.batch == 5
    assert dump_yaml(again) == text


@pytest.mark.slow  # 200 generated networks written and read back: ~1 s of CPU
@settings(max_examples=200, deadline=None)
@given(networks(max_layers=10, dag=True, max_batch=4, activations=("relu", "identity", "sigmoid", "tanh")))
def test_random_networks_round_trip_exactly(net) -> None:
    assert parse_yaml_network(dump_yaml(net)) == net


def test_round_trip_through_a_file(tmp_path) -> None:
    b = NetworkBuilder("odd names", (2, 9, 9), batch=2)
    b.add("yes", Conv2d(3, 3, stride=2, groups=1, bias=True))  # a YAML 1.1 boolean word as a name
    b.add("1", Pool2d("avg", 2, stride=1))  # a number as a name
    net = b.build()
    path = tmp_path / "n.yaml"
    path.write_text(dump_yaml(net))
    assert load_yaml_network(path) == net


@pytest.mark.parametrize(("body", "message"), [
    ("version: 2\n", "version must be 1 (got 2)"),
    ("name: x\n", "version must be 1 (got missing)"),
    ("version: '1'\n", "version must be 1 (got '1')"),
    ("version: 1.0\n", "version must be 1 (got 1.0)"),
    (HEAD + "  - {name: a, type: [linear]}\n", "unknown type ['linear']; allowed: linear"),
    ("- 1\n", "must be a mapping with fields version, name, input_shape, batch, layers"),
    ("version: 1\nshape: [3]\n", "unknown field 'shape'; allowed: version, name, input_shape, batch, layers"),
    ("version: 1\ninput_shape: 4\nlayers: []\n", "input_shape must be a list of positive integers"),
    ("version: 1\ninput_shape: [0]\nlayers: [{name: a, type: relu}]\n", "input_shape must be positive integers"),
    ("version: 1\ninput_shape: [4]\nbatch: 0\nlayers: []\n", "batch must be a positive integer, got 0"),
    ("version: 1\ninput_shape: [4]\nlayers: []\n", "layers must be a non-empty list"),
    (HEAD + "  - 3\n", "layers[0]: a layer must be a mapping"),
    (HEAD + "  - {type: relu}\n", "layers[0] (line 5): field 'name' must be a non-empty string"),
    (HEAD + "  - {name: a, type: lstm}\n",
     "layers[0] 'a' (line 5): unknown type 'lstm'; allowed: linear, conv2d, maxpool, avgpool, flatten, relu, "
     "identity, sigmoid, tanh, add"),
    (HEAD + "  - {name: a, type: linear, out_featurs: 3}\n",
     "unknown field 'out_featurs' for type linear; allowed: name, type, inputs, out_features, bias, activation"),
    (HEAD + "  - {name: a, type: maxpool, kernel_size: 2, mode: max}\n",
     "unknown field 'mode' for type maxpool; allowed: name, type, inputs, kernel_size, stride, padding"),
    (HEAD + "  - {name: a, type: linear}\n", "missing field 'out_features' (type linear needs out_features)"),
    (HEAD + "  - {name: a, type: linear, out_features: 0}\n", "linear.out_features must be a positive integer"),
    (HEAD + "  - {name: a, type: linear, out_features: 2.5}\n", "field 'out_features' must be an integer"),
    (HEAD + "  - {name: a, type: linear, out_features: 2, bias: 1}\n", "field 'bias' must be true/false, got 1"),
    (HEAD + "  - {name: a, type: linear, out_features: 2, activation: gelu}\n",
     "activation 'gelu' is not one of identity, relu, sigmoid, tanh"),
    (HEAD + "  - {name: a, type: linear, out_features: 2, inputs: b}\n", "field 'inputs' must be a list"),
    (HEAD + "  - {name: a, type: linear, out_features: 2, inputs: [b]}\n",
     "layers[0] 'a' (line 5): input 'b' is not an earlier layer or 'input'"),
    (HEAD + "  - {name: a, type: linear, out_features: 2}\n  - {name: b, type: add, inputs: [a, input]}\n",
     "layers[1] 'b' (line 6): add inputs must have one shape, got (2,), (4,)"),
    (HEAD + "  - {name: a, type: relu}\n  - {name: a, type: relu}\n", "layer name 'a' is used twice"),
    (HEAD + "  - {name: a, type: conv2d, out_channels: 2, kernel_size: 3}\n", "conv2d needs a (channels, height"),
    (HEAD.replace("[4]", "[1, 4, 4]") + "  - {name: a, type: maxpool, kernel_size: 2, stride: null}\n", None),
])
def test_validation_messages(body: str, message: str | None) -> None:
    if message is None:
        parse_yaml_network(body, source="f.yaml")  # valid: a null stride is the default
        return
    with pytest.raises(InputError) as info:
        parse_yaml_network(body, source="f.yaml")
    text = str(info.value)
    assert text.startswith("f.yaml: ") and message in text and "\n" not in text


@pytest.mark.parametrize(("body", "message"), [
    ("version: 1\nname: a\nname: b\n", "duplicate key 'name' at line 3 column 1 (first at line 2 column 1)"),
    (HEAD + "  - {name: a, type: linear, out_features: 3, out_features: 4}\n",
     "duplicate key 'out_features' at line 5 column 46 (first at line 5 column 29)"),
    (HEAD + "  - name: a\n    type: relu\n    type: tanh\n", "duplicate key 'type' at line 7 column 5"),
])
def test_duplicate_keys_are_named_with_their_line(body: str, message: str) -> None:
    with pytest.raises(InputError, match="^f.yaml: " + message.replace("(", r"\(").replace(")", r"\)")):
        parse_yaml_network(body, source="f.yaml")


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(allow_nan=False, width=16),
                    st.sampled_from(["input", "a", "b", "relu", "linear", "conv2d", "maxpool", "add", "flatten"]))
_keys = st.sampled_from(["version", "name", "input_shape", "batch", "layers", "type", "inputs", "out_features",
                         "kernel_size", "out_channels", "activation", "stride", "bias", "x"])
_documents = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner,
                                                                                                  max_size=5),
                          max_leaves=25)


@settings(max_examples=100, deadline=None)
@given(st.fixed_dictionaries({"version": st.sampled_from([1, 1, 1, 2, 1.0, True])}, optional={
    "name": _scalars, "input_shape": st.lists(st.integers(-1, 9), max_size=4) | _documents,
    "layers": st.lists(st.dictionaries(_keys, _documents, max_size=6), max_size=4) | _documents}))
def test_any_document_loads_or_fails_with_one_line(doc) -> None:
    """Whatever the document, parsing gives a Network or an InputError of one line; never anything else."""
    text = yaml.safe_dump(doc)
    try:
        parse_yaml_network(text, source="fuzz.yaml")
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.yaml: ")


def test_yaml_syntax_error_is_one_line() -> None:
    with pytest.raises(InputError, match=r"^f.yaml: line 3: invalid YAML: expected ',' or '\]'") as info:
        parse_yaml_network("version: 1\ninput_shape: [4\nlayers: []\n", source="f.yaml")
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------------- through the CLI

CLI_CASES = {
    "unknown_type": (HEAD + "  - {name: a, type: lstm}\n", "unknown type 'lstm'; allowed: linear"),
    "non_positive": (HEAD + "  - {name: a, type: linear, out_features: -1}\n", "out_features must be a positive"),
    "shape_mismatch": (HEAD + "  - {name: a, type: linear, out_features: 2}\n  - {name: b, type: add, inputs: "
                       "[a, input]}\n", "add inputs must have one shape"),
    "duplicate_key": ("version: 1\nversion: 1\n", "duplicate key 'version' at line 2"),
    "wrong_version": ("version: 0\n", "version must be 1"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_exits_2_with_one_line(case: str, tmp_path, capsys) -> None:
    body, message = CLI_CASES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(body)
    assert main(["graph", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"layerpipe: error: {path}: ") and captured.err.count("\n") == 1
    assert message in captured.err


def test_cli_subprocess_duplicate_key_no_traceback(tmp_path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(HEAD + "  - {name: a, type: relu}\n  - {name: b, type: relu, name: c}\n")
    proc = subprocess.run([sys.executable, "-m", "layerpipe.cli", "graph", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"layerpipe: error: {path}: duplicate key 'name' at line 6 column 27 (first at line 6 " \
                          "column 6)\n"


def test_missing_file_is_one_line(capsys) -> None:
    assert main(["graph", "no/such/net.yaml"]) == 2
    assert capsys.readouterr().err == "layerpipe: error: cannot read network file no/such/net.yaml: No such file or " \
                                      "directory\n"
