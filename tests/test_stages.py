"""Stage maps: parsing `0,0,1,2` and `even:M`, and the checks on them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import MacsModel, PEModel, task_cost
from layerpipe.errors import InputError
from layerpipe.network import load_network, mlp
from layerpipe.stages import check_stage_map, even_stages, parse_stage_map, stages_after
from tests.strategies import networks


def test_comma_list() -> None:
    net = mlp([8, 7, 6, 5, 4, 3])
    assert parse_stage_map("0,0,1,2,2", net) == (0, 0, 1, 2, 2)
    assert parse_stage_map(" 0, 1,1,1,2 ", net) == (0, 1, 1, 1, 2)
    assert stages_after((0, 0, 1, 2, 2)) == (2, 2, 1, 0, 0)


@pytest.mark.parametrize(("spec", "message"), [
    ("0,0,1", "expected 5 stages"),
    ("0,0,1,2,2,2", "expected 5 stages"),
    ("0,1,0,1,1", "non-decreasing along the chain"),
    ("0,-1,0,1,1", ">= 0"),
    ("0,0,2,2,2", "stage 1 is empty"),
    ("1,1,1,1,1", "stage 0 is empty"),
    ("0,x,1,1,1", "comma list"),
    ("", "comma list"),
    ("even:0", "1 <= M <= 5"),
    ("even:6", "1 <= M <= 5"),
    ("even:-2", "1 <= M <= 5"),
    ("even:two", "integer M"),
])
def test_bad_stage_maps_name_the_field(spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        parse_stage_map(spec, mlp([8, 7, 6, 5, 4, 3]))
    text = str(info.value)
    assert text.startswith("--stages") and "\n" not in text


def test_dag_stage_maps_must_rise_along_every_edge() -> None:
    net = load_network("resnet18")
    stages = [0] * len(net)
    stages[4] = 1  # layer1.0.add on stage 1, but layer1.1.conv1 (which reads it) left on stage 0
    with pytest.raises(InputError, match=r"along every edge; layer 'layer1\.1\.conv1'"):
        check_stage_map(stages, net)


def test_even_split_by_hand() -> None:
    # MACs of F: 6·20 = 120, 20·20 = 400, 20·10 = 200, 10·2 = 20. Two stages: {1,2} = 520 vs {3,4} = 220,
    # or {1} = 120 vs {2,3,4} = 620, or {1,2,3} = 720: the first is best.
    net = mlp([6, 20, 20, 10, 2])
    assert even_stages(net, 2) == (0, 0, 1, 1)
    assert even_stages(net, 1) == (0, 0, 0, 0)
    assert even_stages(net, 4) == (0, 1, 2, 3)
    assert parse_stage_map("even:2", net) == (0, 0, 1, 1)


def test_even_split_follows_the_cost_model() -> None:
    # With a huge per-op overhead every layer costs about the same, so 2 stages split 2 + 2.
    net = mlp([6, 200, 2, 2, 2])
    assert even_stages(net, 2, MacsModel()) == (0, 1, 1, 1)
    assert even_stages(net, 2, PEModel(lanes=64, overhead=10_000)) == (0, 0, 1, 1)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_even_split_is_contiguous_valid_and_optimal(data: st.DataObject) -> None:
    net = data.draw(networks(max_layers=7, dag=True))
    m = data.draw(st.integers(1, len(net)))
    stages = even_stages(net, m)
    assert check_stage_map(stages, net) == stages
    assert max(stages) == m - 1 and list(stages) == sorted(stages)
    cost = [task_cost(MacsModel(), layer, "F", net.batch) for layer in net.layers]

    def bottleneck(cuts: tuple[int, ...]) -> int:
        bounds = (0, *cuts, len(cost))
        return max(sum(cost[a:b]) for a, b in itertools.pairwise(bounds))

    brute = min(bottleneck(c) for c in itertools.combinations(range(1, len(net)), m - 1))
    cuts = tuple(i for i in range(1, len(net)) if stages[i] != stages[i - 1])
    assert bottleneck(cuts) == brute


def test_one_partitioner_for_stage_maps_and_policies() -> None:
    # even:M and the pipeline policies cut with the same function (issue 13: two partitioners disagreed on
    # the cuts in 18 of 47 zoo cases); zero-weight items (flatten) and too many parts behave the same.
    from layerpipe.schedule import _balance
    from layerpipe.stages import partition_contiguous

    assert _balance.partition_contiguous is partition_contiguous
    assert partition_contiguous([5, 0, 0, 5], 2) == [[0, 1, 2], [3]]
    with pytest.raises(ValueError, match="cannot split 2 items into 3"):
        partition_contiguous([1, 1], 3)
