"""Rung (c) for convolution in hardware: compiled conv networks executed by the microcode model (hdl/_model.py)
reach the integer reference's final weights, on generated small conv networks under both policies.

Each generated network is conv2d (kernel, stride, padding, channels) → optional pooling (max or avg) → optional
second conv2d → flatten → linear (ReLU) → linear; scheduled by `pipedream` or `layerpipe` on 1–3 PEs under the
`rtl` cost model and compiled. The model runs the program's window steps with their loop nests in the
simulator's timing order, reading the weight versions the compiler pinned; a wrong address, version, ring depth
or transfer shows up as a different final weight.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from layerpipe.errors import InputError
from layerpipe.hdl._flow import make_design
from layerpipe.hdl._model import run_program
from layerpipe.network import Conv2d, Flatten, Linear, Network, NetworkBuilder, Pool2d

pytest.importorskip("torch")


@st.composite
def conv_networks(draw: st.DrawFn) -> Network:
    batch = draw(st.sampled_from([1, 2]))
    channels = draw(st.integers(1, 2))
    size = draw(st.integers(4, 8))
    b = NetworkBuilder("gen", (channels, size, size), batch)
    kernel = draw(st.integers(1, 3))
    # A drawn kernel or window may not fit what the layers before leave (the builder checks each layer as it is
    # added): such draws are rejected, not failures.
    try:
        b.add("conv1", Conv2d(draw(st.integers(1, 3)), kernel, draw(st.integers(1, 2)),
                              draw(st.integers(0, kernel - 1)), activation="relu"))
        pool = draw(st.sampled_from(["none", "max", "avg"]))
        if pool != "none":
            b.add("pool1", Pool2d(pool, 2, draw(st.integers(1, 2))))
        if draw(st.booleans()):
            b.add("conv2", Conv2d(draw(st.integers(1, 3)), draw(st.integers(1, 2)), activation="relu"))
        b.add("flatten", Flatten())
        b.add("fc1", Linear(draw(st.integers(2, 6)), activation="relu"))
        b.add("fc2", Linear(draw(st.integers(1, 4))))
        return b.build()
    except InputError:
        reject()


def _check(network: Network, policy: str, pes: int, lanes: int, samples: int = 3, seed: int = 0) -> None:
    design = make_design(network, policy, pes, lanes, samples)
    vectors = design.vectors(seed)
    run = run_program(design.program, design, vectors)
    for layer in vectors["layers"]:
        np.testing.assert_array_equal(run.weights[f"W{layer['layer']}"], np.asarray(layer["final"]),
                                      err_msg=f"W{layer['layer']} of {network.name}")


@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(conv_networks(), st.sampled_from(["pipedream", "layerpipe"]), st.integers(1, 3), st.sampled_from([1, 2, 4]),
       st.integers(0, 1000))
def test_model_reaches_the_reference_weights_on_generated_conv_networks(network: Network, policy: str, pes: int,
                                                                         lanes: int, seed: int) -> None:
    try:
        design = make_design(network, policy, pes, lanes, 3)
    except InputError as exc:  # the placements the RTL refuses, each in one line (tested below)
        if any(m in str(exc) for m in ("its kept input", "padded to whole words", "not a multiple of --lanes",
                                       "replicated placement", "splits a heavy layer")):
            reject()
        raise
    vectors = design.vectors(seed)
    run = run_program(design.program, design, vectors)
    for layer in vectors["layers"]:
        np.testing.assert_array_equal(run.weights[f"W{layer['layer']}"], np.asarray(layer["final"]))


@pytest.mark.parametrize(("policy", "pes"), [("pipedream", 2), ("pipedream", 3), ("layerpipe", 2), ("layerpipe", 3)])
def test_model_reaches_the_reference_weights_on_the_lenet5_shaped_network(policy: str, pes: int) -> None:
    # layerpipe on 2 PEs puts pool1's F and E on different PEs: the argmax mask travels over a link.
    _check(_lenet(), policy, pes, 4)


def _lenet() -> Network:
    from layerpipe.network import load_network

    return load_network("examples/lenet5_12x12.yaml")


def test_a_wrong_argmax_mask_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model is not a tautology of the reference: pooling E reading a mask shifted by one tap fails."""
    import layerpipe.hdl._conv as conv

    real = conv.run_window

    def shifted(window: conv.Window, fmt: object, p: np.ndarray, q: np.ndarray | None = None) -> tuple:
        if window.op == "pool_e" and q is not None:
            q = (q + 1) % window.kernel**2
        return real(window, fmt, p, q)  # type: ignore[arg-type]

    monkeypatch.setattr(conv, "run_window", shifted)
    with pytest.raises(AssertionError):
        _check(_lenet(), "pipedream", 2, 4)


@pytest.mark.parametrize(("build", "message"), [
    (lambda b: b.add("c", Conv2d(2, 3, bias=True, activation="relu")), "bias=true"),
    (lambda b: b.add("c", Conv2d(2, 3, activation="sigmoid")), "sigmoid"),
    (lambda b: b.add("c", Conv2d(2, 3, activation="relu")).add("p", Pool2d("avg", 3)), "power-of-two"),
    (lambda b: b.add("p", Pool2d("max", 2)), "not on the network input"),
])
def test_refusals_name_the_layer(build: object, message: str) -> None:
    b = NetworkBuilder("r", (1, 8, 8))
    build(b)  # type: ignore[operator]
    net = b.add("f", Flatten()).add("fc", Linear(2)).build()
    with pytest.raises(InputError, match=message):
        make_design(net, "pipedream", 2, 4, 2)
