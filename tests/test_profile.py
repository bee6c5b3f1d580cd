"""The `profiled` cost model's measuring side: `layerpipe.profile` and `layerpipe profile`."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from layerpipe.cli import main
from layerpipe.costs import ATOMIC_KINDS, ProfiledModel, make_cost_model, task_cost
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.profile import profile_network


@pytest.mark.parametrize("spec", ["mlp:7-6-5-3", "lenet5"])
def test_profile_file_is_a_cost_model_for_every_task(spec: str, tmp_path) -> None:
    out = tmp_path / "profile.json"
    assert main(["profile", spec, "--batch", "2", "--repeats", "2", "--warmup", "0", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["version"] == 1 and doc["unit"] == "ns" and doc["batch"] == 2
    net = load_network(spec, 2)
    model = make_cost_model("profiled", profile=str(out))
    assert isinstance(model, ProfiledModel) and model.network == net.name
    # Every task of every graph variant has a positive time, and a fused task costs the sum of its parts.
    for options in (GraphOptions(), GraphOptions(intra=False), GraphOptions(inter=False), GraphOptions.pipedream()):
        graph = build_training_graph(net, options)
        costs = graph.costs(model)
        assert costs and all(c > 0 for c in costs.values())
        for task, cost in costs.items():
            layer = net.layer(task.layer)
            assert cost == sum(doc["layers"][layer.name][k] for k in task.kind)
    # Exactly the measured tasks: F and E for weightless layers, FAEGU for weight layers (no E for the first).
    for layer in net.layers:
        kinds = set(doc["layers"][layer.name])
        if layer.has_weights:
            assert kinds == set(ATOMIC_KINDS) - ({"E"} if layer.takes_network_input else set())
        else:
            assert kinds == {"F", "E"}
    # The wrong batch is refused with a one-line error.
    with pytest.raises(InputError, match="measured at batch 2"):
        task_cost(model, net.layer(1), "F", 1)


def test_bigger_layers_take_longer() -> None:
    """A 1024x1024 matmul (8 Mi MAC at batch 8) is measured slower than a 1024x1 one (8 Ki MAC)."""
    net = load_network("mlp:1024-1024-1", 8)
    model = profile_network(net, repeats=3)
    big, small = model.times_ns["fc1"], model.times_ns["fc2"]
    assert big["F"] > small["F"] and big["G"] > small["G"] and big["U"] > small["U"]


def test_profile_to_stdout_and_bad_input(capsys) -> None:
    assert main(["profile", "mlp:4-3", "--repeats", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["layers"]["fc1"]) == {"F", "A", "G", "U"}
    assert main(["profile", "mlp:4-3", "--repeats", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--repeats must be a positive integer (>= 1), got 0" in err
    assert main(["profile", "nonet"]) == 2
    assert "unknown network 'nonet'" in capsys.readouterr().err
