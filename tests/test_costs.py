"""Cost models on hand-computed small cases; fused tasks cost the sum of their parts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import (
    ATOMIC_KINDS,
    MacsModel,
    PEModel,
    ProfiledModel,
    atomic_work,
    make_cost_model,
    network_costs,
    task_cost,
)
from layerpipe.dfg import GraphOptions, build_training_graph
from layerpipe.errors import InputError
from layerpipe.network import Activation, Add, Conv2d, Flatten, Linear, NetworkBuilder, Pool2d, load_network
from tests.strategies import networks

MACS = MacsModel()


def test_mlp_macs_by_hand() -> None:
    # mlp:7-6-5-3 at B = 2: F = E = G = B·n_in·n_out, A = B·n_out, U = n_in·n_out (design notes §2).
    net = load_network("mlp:7-6-5-3", batch=2)
    want = {
        (1, "F"): 84, (1, "A"): 12, (1, "G"): 84, (1, "U"): 42,  # fc1 reads the network input: no E
        (2, "F"): 60, (2, "A"): 10, (2, "E"): 60, (2, "G"): 60, (2, "U"): 30,
        (3, "F"): 30, (3, "A"): 6, (3, "E"): 30, (3, "G"): 30, (3, "U"): 15,
    }
    assert network_costs(MACS, net) == want


def test_pe_model_by_hand() -> None:
    net = load_network("mlp:7-6-5-3", batch=2)
    pe = PEModel(lanes=4, overhead=3)
    fc1, fc2 = net.layer(1), net.layer(2)
    assert task_cost(pe, fc1, "F", 2) == 21 + 3  # ceil(84 / 4) + 3
    assert task_cost(pe, fc1, "A", 2) == 3 + 3
    assert task_cost(pe, fc1, "U", 2) == 11 + 3  # ceil(42 / 4) + 3
    # A fused task pays the overhead once per atomic part: ceil(10/4)+3 + ceil(60/4)+3 + ceil(60/4)+3.
    assert task_cost(pe, fc2, "AEG", 2) == 6 + 18 + 18
    assert PEModel(lanes=1, overhead=0).atomic_cost(fc2, "G", 2) == MACS.atomic_cost(fc2, "G", 2)


def test_conv_pool_add_activation_by_hand() -> None:
    b = NetworkBuilder("small", (1, 5, 5))
    b.add("conv", Conv2d(2, 3, activation="relu"))  # out (2, 3, 3): 18 outputs, 9 MACs each
    b.add("pool", Pool2d("max", 2, stride=1))  # out (2, 2, 2), 4 compares each
    b.add("flat", Flatten())
    b.add("fc", Linear(8))
    b.add("act", Activation("tanh"))
    b.add("join", Add(activation="relu"), ["act", "flat"])
    net = b.build()
    costs = network_costs(MACS, net)
    assert [costs[(1, k)] for k in "FAGU"] == [162, 18, 162, 18]
    assert (1, "E") not in costs
    assert (costs[(2, "F")], costs[(2, "E")]) == (32, 32)
    assert (costs[(3, "F")], costs[(3, "E")]) == (0, 0)  # a reshape
    assert [costs[(4, k)] for k in "FAEGU"] == [64, 8, 64, 64, 64]
    assert (costs[(5, "F")], costs[(5, "E")]) == (8, 8)  # e ⊙ f'(z), once
    assert (costs[(6, "F")], costs[(6, "E")]) == (8, 16)  # the sum, then the fused ReLU's backward too
    with pytest.raises(ValueError, match="has no weights and no A task"):
        atomic_work(net.layer(2), "A", 1)
    with pytest.raises(ValueError, match="atomic task kind"):
        atomic_work(net.layer(1), "AE", 1)


def test_batch_scales_everything_but_the_update() -> None:
    one, four = load_network("lenet5", 1), load_network("lenet5", 4)
    c1, c4 = network_costs(MACS, one), network_costs(MACS, four)
    assert c1.keys() == c4.keys()
    for (layer, kind), cost in c1.items():
        assert c4[(layer, kind)] == (cost if kind == "U" else 4 * cost)


@settings(max_examples=200, deadline=None)
@given(networks(max_layers=8, max_batch=4), st.sampled_from([MACS, PEModel(7, 5), PEModel(1, 0)]))
def test_fused_task_costs_the_sum_of_its_atomic_parts(net, model) -> None:
    atomic = network_costs(model, net)
    for options in (GraphOptions(), GraphOptions(intra=False), GraphOptions(inter=False), GraphOptions.pipedream()):
        graph = build_training_graph(net, options)
        costs = graph.costs(model)
        for task, cost in costs.items():
            assert cost == sum(atomic[(task.layer, k)] for k in task.kind)
        # Every variant does the same total work: fusing only groups it.
        assert sum(costs.values()) == sum(atomic.values())


def test_make_cost_model(tmp_path) -> None:
    assert make_cost_model("macs") == MACS
    assert make_cost_model("pe", lanes=8, overhead=2) == PEModel(8, 2)
    with pytest.raises(InputError, match="unknown cost model 'gpu'; allowed: macs, pe, profiled, rtl"):
        make_cost_model("gpu")
    with pytest.raises(InputError, match=r"needs --profile FILE\.json"):
        make_cost_model("profiled")
    with pytest.raises(InputError, match="lanes must be >= 1"):
        PEModel(lanes=0)
    with pytest.raises(InputError, match="overhead must be >= 0"):
        PEModel(overhead=-1)


def test_profiled_model_json_round_trip(tmp_path) -> None:
    net = load_network("mlp:4-3-2", batch=2)
    times = {"fc1": {"F": 10, "A": 2, "G": 11, "U": 3}, "fc2": {"F": 7, "A": 1, "E": 6, "G": 8, "U": 2}}
    model = ProfiledModel(net.name, 2, times)
    path = tmp_path / "p.json"
    path.write_text(model.to_json())
    loaded = make_cost_model("profiled", profile=str(path))
    assert loaded == model
    assert task_cost(loaded, net.layer(2), "AEG", 2) == 1 + 6 + 8
    assert build_training_graph(net).costs(loaded) == {t: sum(times[net.layer(t.layer).name][k] for k in t.kind)
                                                        for t in build_training_graph(net).tasks}
    with pytest.raises(InputError, match="measured at batch 2, asked for batch 1"):
        task_cost(loaded, net.layer(1), "F", 1)
    with pytest.raises(InputError, match="no time for E of layer 'fc1'"):
        task_cost(loaded, net.layer(1), "E", 2)


@pytest.mark.parametrize(("content", "message"), [
    ("{", "profile file .*: Expecting"),
    (json.dumps({"version": 2}), "field 'version' must be 1"),
    (json.dumps({"version": 1, "network": "x", "batch": 1}), "missing field 'layers'"),
    (json.dumps({"version": 1, "network": "x", "batch": "one", "layers": {}}), "'batch' must be an integer"),
    (json.dumps({"version": 1, "network": "x", "batch": 1, "layers": []}), "'layers' a mapping"),
])
def test_profiled_model_bad_files(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message) as info:
        ProfiledModel.from_json(path)
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="No such file"):
        ProfiledModel.from_json(tmp_path / "missing.json")


def test_network_costs_matches_graph_tasks() -> None:
    """The (layer, kind) pairs network_costs returns are exactly the atomic parts of the DFG's tasks."""
    for spec in ("mlp:7-6-5-3", "lenet5", "resnet18"):
        net = load_network(spec)
        graph = build_training_graph(net)
        parts = {(t.layer, k) for t in graph.tasks for k in t.kind}
        assert parts == set(network_costs(MACS, net, ATOMIC_KINDS))
