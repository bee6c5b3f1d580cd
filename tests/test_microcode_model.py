"""The microcode-level model (`layerpipe.hdl._model`): the compiled program executed in Python, op by op, must
end with the integer PyTorch reference's weights — on the policies' designs and on generated placements with
micro-batches and both weight modes. A compiler fault (address, version, ring depth, transfer slot) fails here
without any RTL."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from layerpipe.hdl._flow import Design, make_design
from layerpipe.hdl._model import run_program
from tests.rtl_placements import placed_design, placements


def _check(design: Design, seed: int = 0) -> None:
    vectors = design.vectors(seed)
    run = run_program(design.program, design, vectors)
    for layer in vectors["layers"]:
        assert run.weights[f"W{layer['layer']}"].tolist() == layer["final"], f"W{layer['layer']}"
    # Every op of the run produced a value (one per atomic step).
    assert len(run.outputs) == vectors["commands"]


@pytest.mark.parametrize(("network", "policy", "n", "lanes", "batch"), [
    ("mlp:7-6-5-3", "layerpipe", 3, 1, 1),
    ("mlp:9-8-4-6-2", "pipedream", 2, 4, 1),
    ("mlp:6-5-3", "pipedream", 2, 1, 3),
])
def test_model_matches_the_reference_on_policy_designs(network: str, policy: str, n: int, lanes: int,
                                                        batch: int) -> None:
    _check(make_design(network, policy, n, lanes, 6, batch=batch))


@settings(max_examples=10, deadline=None)
@given(point=placements(), samples=st.integers(1, 8), mode=st.sampled_from(["stash", "latest"]),
       batch=st.sampled_from([1, 2, 4]), seed=st.integers(0, 3))
def test_model_matches_the_reference_on_generated_placements(point: tuple[list[int], dict[str, int], int, int],
                                                              samples: int, mode: str, batch: int,
                                                              seed: int) -> None:
    widths, where, n, lanes = point
    _check(placed_design(widths, where, n, lanes, samples, mode, batch), seed)


def test_a_wrong_version_is_caught_by_the_model() -> None:
    """The model is not a tautology: the same program with F2 reading one version older ends elsewhere.

    (T = 64: at a learning rate of 2^-4 consecutive versions of this small network often agree, so a short
    run can end on the same weights with either version.)"""
    from dataclasses import replace

    design = make_design("mlp:7-6-5-3", "layerpipe", 2, 1, 64)
    prog = design.program
    pes = []
    for pe in prog.pes:
        entries = tuple(replace(e, steps=tuple(replace(s, version=s.version - 1) if (s.kind, s.layer) == ("F", 2)
                                               else s for s in e.steps)) for e in pe.entries)
        pes.append(replace(pe, entries=entries))
    vectors = design.vectors(0)
    run = run_program(replace(prog, pes=tuple(pes)), design, vectors)
    assert any(not np.array_equal(run.weights[f"W{layer['layer']}"], layer["final"]) for layer in vectors["layers"])
