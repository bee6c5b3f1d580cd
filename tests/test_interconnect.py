"""The interconnect model (`layerpipe.interconnect`): specs, exact hold times, and the simulator's use of it.

One model is shared by the schedulers, the simulator and the reports: a transfer of v words holds its channel
⌈v / w⌉ cycles (w may be a fraction), arrives `latency` later, and uses link p→q (`links`, `rtl`) or the one
bus channel (`bus`); `shared` moves data for free.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import PEModel
from layerpipe.errors import InputError
from layerpipe.interconnect import RTL_LINK_LATENCY, SHARED, Interconnect, parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule import make_schedule
from layerpipe.sim import SimConfig, link_hold_cycles, simulate_policy_result


@pytest.mark.parametrize(("spec", "kind", "latency", "w", "label"), [
    ("shared", "shared", 0, None, "shared"),
    ("links:2:16", "links", 2, Fraction(16), "links:2:16"),
    ("links:0:1/16", "links", 0, Fraction(1, 16), "links:0:1/16"),
    ("links:3:4/2", "links", 3, Fraction(2), "links:3:2"),
    ("bus:5:3/4", "bus", 5, Fraction(3, 4), "bus:5:3/4"),
    (" rtl ", "links", RTL_LINK_LATENCY, Fraction(8), "rtl"),
])
def test_specs_parse_to_the_model(spec, kind, latency, w, label) -> None:
    ic = parse_interconnect(spec, lanes=8)
    assert (ic.kind, ic.latency, ic.words_per_cycle, ic.spec) == (kind, latency, w, label)
    assert parse_interconnect(ic.spec, lanes=8) == ic  # the spec a result names reads back to the same model


@pytest.mark.parametrize(("spec", "message"), [
    ("links:2", "links needs links:LATENCY:WORDS_PER_CYCLE"),
    ("bus", "bus needs bus:LATENCY:WORDS_PER_CYCLE"),
    ("links:2:0", "WORDS_PER_CYCLE must be > 0"),
    ("links:2:-1", "WORDS_PER_CYCLE must be a positive integer or a fraction"),
    ("links:2:1/0", "divides by zero"),
    ("links:2:0/5", "WORDS_PER_CYCLE must be > 0"),
    ("links:2:1.5", "WORDS_PER_CYCLE must be a positive integer or a fraction"),
    ("links:-1:4", "LATENCY must be an integer"),
    ("links:x:4", "LATENCY must be an integer"),
    ("links:2:4:9", "links needs links:LATENCY:WORDS_PER_CYCLE"),
    ("ring:1:1", "is not one of the forms shared, links:LATENCY:WORDS_PER_CYCLE"),
    ("shared:1", "is not one of the forms"),
    ("", "is not one of the forms"),
    ("links:2:99999999999", "terms must be <="),
])
def test_bad_specs_are_one_line_errors_naming_the_forms(spec, message) -> None:
    with pytest.raises(InputError) as info:
        parse_interconnect(spec, lanes=4)
    text = str(info.value)
    assert message in text and "\n" not in text and text.startswith("--interconnect")


def test_rtl_needs_lanes() -> None:
    with pytest.raises(InputError, match="needs the PE lanes"):
        parse_interconnect("rtl")
    assert Interconnect.rtl(4) == parse_interconnect("rtl", lanes=4)


@settings(max_examples=300, deadline=None)
@given(words=st.integers(0, 10**7), num=st.integers(1, 64), den=st.integers(1, 64), latency=st.integers(0, 50))
def test_hold_is_the_exact_ceiling_everywhere(words, num, den, latency) -> None:
    w = Fraction(num, den)
    ic = Interconnect.links(latency, w)
    expected = 0 if words == 0 else -(-words * den // num)
    assert ic.hold(words) == expected == link_hold_cycles(words, w)
    assert ic.transfer_cycles(words) == expected + latency
    assert SimConfig.of(ic).hold_cycles(words) == expected
    assert SHARED.transfer_cycles(words) == 0


def test_channels_are_links_per_pair_or_one_bus() -> None:
    links, bus = Interconnect.links(1, 2), Interconnect.bus(1, 2)
    assert {links.channel(p, q, 4) for p in range(4) for q in range(4) if p != q} == set(range(16)) - {0, 5, 10, 15}
    assert {bus.channel(p, q, 4) for p in range(4) for q in range(4)} == {0}
    assert (links.num_channels(4), bus.num_channels(4), SHARED.num_channels(4)) == (16, 1, 0)


def test_sim_config_round_trips_the_model() -> None:
    for spec in ("shared", "links:2:1/16", "bus:3:5", "rtl"):
        ic = parse_interconnect(spec, lanes=4)
        config = SimConfig.of(ic, "latest")
        assert config.model == ic and config.mode == "latest"
        assert config.describe()["interconnect"] == ic.kind


def test_a_bus_is_slower_than_links_when_transfers_overlap() -> None:
    """One medium serialises transfers that links carry side by side: the same schedule (planned on the
    links) simulated on a bus of the same bandwidth takes at least as long."""
    net, model = load_network("lenet5"), PEModel()
    links, bus = Interconnect.links(2, Fraction(1, 4)), Interconnect.bus(2, Fraction(1, 4))
    result = make_schedule("layerpipe", net, 4, model, interconnect=links)
    on_links = simulate_policy_result(result, net, model, 40, SimConfig.of(links))
    on_bus = simulate_policy_result(result, net, model, 40, SimConfig.of(bus))
    assert on_bus.total_cycles >= on_links.total_cycles
    assert on_links.traffic_words == on_bus.traffic_words > 0
