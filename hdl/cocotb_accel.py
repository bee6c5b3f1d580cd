"""Whole-accelerator cocotb bench, part of the package so `layerpipe verify` runs from a wheel (launched by
`layerpipe.hdl._flow.run_bench` through cocotb_tools.runner).

Roles are kept apart:
- `Model`   — the expected behaviour, read from the vectors file pytest wrote (integer PyTorch reference for the
              weights, the Python simulator for the cycle count); no computation of its own;
- `Driver`  — drives the host ports: loads initial weights, streams the samples (x, target) with optional random
              valid stalls, starts a run, resets in the middle of one;
- `Monitor` — observes: waits for done, reads the cycle and op counters and reads back every weight;
- `CommandMonitor` — passive, per cycle: each PE's issued ops (entry, iteration, cycle) and each link's beats;
- `Checker` — compares what the monitors saw with the model (final weights, cycles, the simulator's op trace
              op by op, the program's link traffic) and writes the observation to a result file.

Inputs are driven and outputs sampled on the falling clock edge, so every value is stable when looked at.
Environment: LAYERPIPE_VECTORS (vectors JSON), LAYERPIPE_RESULT (where to write the observation, optional),
LAYERPIPE_STALL (probability that the sample stream's valid is low, and that each link's ready is low, in a
cycle; default 0.3 for the stall test).
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge, with_timeout


def pack(values: list[int], bits: int) -> int:
    word = 0
    for j, v in enumerate(values):
        word |= (int(v) & ((1 << bits) - 1)) << (j * bits)
    return word


def unpack(word: int, lanes: int, bits: int) -> list[int]:
    out = []
    for j in range(lanes):
        v = (word >> (j * bits)) & ((1 << bits) - 1)
        out.append(v - (1 << bits) if v >> (bits - 1) else v)
    return out


def words_of(values: list[int], lanes: int, bits: int) -> list[int]:
    padded = list(values) + [0] * (-len(values) % lanes)
    return [pack(padded[i:i + lanes], bits) for i in range(0, len(padded), lanes)]


@dataclass
class Model:
    """What the run must produce, as computed outside the simulator."""

    doc: dict[str, Any]

    @staticmethod
    def load() -> Model:
        with open(os.environ["LAYERPIPE_VECTORS"]) as fh:
            return Model(json.load(fh))

    @property
    def lanes(self) -> int:
        return self.doc["lanes"]

    @property
    def bits(self) -> int:
        return self.doc["total_bits"]

    @property
    def samples(self) -> int:
        return self.doc["samples"]

    @property
    def cycles(self) -> int:
        return self.doc["cycles_sim"]

    @property
    def ops(self) -> int:
        return self.doc["commands"]

    def final_weights(self) -> dict[int, list[list[int]]]:
        return {layer["layer"]: layer["final"] for layer in self.doc["layers"]}


class Driver:
    def __init__(self, dut: Any, model: Model, rng: random.Random) -> None:
        self.dut = dut
        self.model = model
        self.rng = rng

    async def reset(self, cycles: int = 2) -> None:
        dut = self.dut
        await FallingEdge(dut.clk)
        dut.rst.value = 1
        dut.start.value = 0
        dut.samples__valid.value = 0
        dut.host_w_en.value = 0
        dut.link_stall.value = 0
        await ClockCycles(dut.clk, cycles, rising=False)
        dut.rst.value = 0

    async def load_weights(self) -> None:
        dut, lanes, bits = self.dut, self.model.lanes, self.model.bits
        for layer in self.model.doc["layers"]:
            # The owner's ring and every received copy (PEs running F / E away from the owner) hold version 0.
            for pe, base in [[layer["pe"], layer["init_addr"]], *layer.get("copies", [])]:
                for r, row in enumerate(layer["init"]):
                    for k, word in enumerate(words_of(row, lanes, bits)):
                        await FallingEdge(dut.clk)
                        dut.host_pe.value = pe
                        dut.host_addr.value = base + r * layer["row_words"] + k
                        dut.host_w_data.value = word
                        dut.host_w_en.value = 1
        await FallingEdge(dut.clk)
        dut.host_w_en.value = 0

    async def stream_samples(self, stall: float) -> None:
        """x(t) words then y(t) words for every iteration t (B samples each); valid drops with probability `stall`
        in each cycle."""
        dut, lanes, bits = self.dut, self.model.lanes, self.model.bits
        words = []
        batch = self.model.doc.get("batch", 1)
        xs, ys = self.model.doc["x"], self.model.doc["y"]
        for t in range(0, len(xs), batch):  # iteration t: its micro-batch's x rows, then their y rows
            for x in xs[t:t + batch]:
                words += words_of(x, lanes, bits)
            for y in ys[t:t + batch]:
                words += words_of(y, lanes, bits)
        for word in words:
            while True:
                await FallingEdge(dut.clk)
                if self.rng.random() >= stall:
                    break
                dut.samples__valid.value = 0
            dut.samples__payload.value = word
            dut.samples__valid.value = 1
            assert dut.samples__ready.value == 1, "the sample loader must be ready before a run, below max_samples"
        await FallingEdge(dut.clk)
        dut.samples__valid.value = 0

    async def inject_link_stalls(self, probability: float, links: int) -> None:
        """Every cycle, each link's receiver is not ready with `probability` (runs until cancelled). Driven just
        after the rising edge, so the value is settled when the monitors sample at the falling edge."""
        dut = self.dut
        while True:
            await RisingEdge(dut.clk)
            bits = 0
            for k in range(links):
                if self.rng.random() < probability:
                    bits |= 1 << k
            dut.link_stall.value = bits

    async def offer_word(self) -> None:
        """Offer one sample word for a cycle (a protocol probe: during a run or past max_samples → error)."""
        dut = self.dut
        await FallingEdge(dut.clk)
        dut.samples__payload.value = 0
        dut.samples__valid.value = 1
        await FallingEdge(dut.clk)
        dut.samples__valid.value = 0

    async def start(self) -> None:
        dut = self.dut
        await FallingEdge(dut.clk)
        dut.samples_count.value = self.model.samples
        dut.start.value = 1
        await FallingEdge(dut.clk)
        dut.start.value = 0


class Monitor:
    def __init__(self, dut: Any, model: Model) -> None:
        self.dut = dut
        self.model = model

    async def wait_done(self, stalled: bool = False) -> None:
        dut = self.dut
        if dut.done.value != 1:
            # 10 ns per cycle: 5× the simulator's cycles (20× with stalls injected), plus a margin.
            await with_timeout(RisingEdge(dut.done), (200 if stalled else 50) * self.model.cycles + 10_000, "ns")
        await FallingEdge(dut.clk)

    def counters(self) -> dict[str, int]:
        dut = self.dut
        return {"cycles": int(dut.cycles.value), "ops": int(dut.ops.value), "error": int(dut.error.value)}

    async def read_weights(self) -> dict[int, list[list[int]]]:
        """Every layer's final weights; the read data follows the address by one cycle."""
        dut, lanes, bits = self.dut, self.model.lanes, self.model.bits
        out: dict[int, list[list[int]]] = {}
        for layer in self.model.doc["layers"]:
            rows = []
            for r in range(layer["rows"]):
                row: list[int] = []
                for k in range(layer["row_words"]):
                    await FallingEdge(dut.clk)
                    dut.host_pe.value = layer["pe"]
                    dut.host_addr.value = layer["final_addr"] + r * layer["row_words"] + k
                    await FallingEdge(dut.clk)
                    row += unpack(int(dut.host_r_data.value), lanes, bits)
                rows.append(row[: layer["cols"]])
            out[layer["layer"]] = rows
        return out


class CommandMonitor:
    """Passive: every entry issued on each PE's command stream, as [entry, iteration, cycle] (the cycle counter
    in the issue cycle), from the accelerator's trace taps. Also every beat on each link."""

    def __init__(self, dut: Any, model: Model) -> None:
        self.dut = dut
        self.num_pes = model.doc["num_pes"]
        self.num_links = len(model.doc.get("links", []))
        self.ops: list[list[list[int]]] = []
        self.links: list[list[int]] = []
        self._task: Any = None

    def start(self) -> None:
        self.ops = [[] for _ in range(self.num_pes)]
        self.links = [[0, 0] for _ in range(self.num_links)]
        self._task = cocotb.start_soon(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        dut = self.dut
        taps = [(getattr(dut, f"trace{p}_valid"), getattr(dut, f"trace{p}_entry"), getattr(dut, f"trace{p}_iter"))
                for p in range(self.num_pes)]
        beats = [(getattr(dut, f"link{k}_beat"), getattr(dut, f"link{k}_last")) for k in range(self.num_links)]
        while True:
            await FallingEdge(dut.clk)  # comb taps of this cycle, stable half a cycle before its edge
            for p, (valid, entry, iteration) in enumerate(taps):
                if valid.value == 1:
                    self.ops[p].append([int(entry.value), int(iteration.value), int(dut.cycles.value)])
            for k, (beat, last) in enumerate(beats):
                if beat.value == 1:
                    self.links[k][1] += 1
                    self.links[k][0] += int(last.value)


def measured_period(ops: list[list[list[int]]]) -> dict[str, Any] | None:
    """The RTL's steady-state period, measured from the monitored issue cycles: for every (PE, entry), the cycles
    between its issues in the run's two middle iterations (the fill should be over there and the drain, where
    entries of iterations past T are skipped, has not begun). `period_rtl` is the largest gap: the slowest PE sets
    the rate of the run (a PE with slack in the period may run ahead while its queues and rings allow, with
    shorter gaps: `period_rtl_min`). The run counts as steady only when the pair of iterations before the middle
    gives the same largest gap; otherwise (T too short for the fill to settle), and with fewer than four
    iterations, None."""
    seen: dict[tuple[int, int], dict[int, int]] = {}
    for p, issued in enumerate(ops):
        for entry, iteration, cycle in issued:
            seen.setdefault((p, entry), {})[iteration] = cycle
    final = max((t for cycles in seen.values() for t in cycles), default=-1)
    middle = final // 2

    def gaps(t: int) -> list[int]:
        return [cycles[t + 1] - cycles[t] for cycles in seen.values() if t in cycles and t + 1 in cycles]

    now, before = gaps(middle), gaps(middle - 1)
    if final < 3 or not now or not before or max(now) != max(before):
        return None
    return {"period_rtl": max(now), "period_rtl_min": min(now), "period_rtl_iterations": [middle, middle + 1]}


class Checker:
    def __init__(self, model: Model) -> None:
        self.model = model

    def check(self, counters: dict[str, Any], weights: dict[int, list[list[int]]], label: str,
              exact_cycles: bool = True) -> None:
        """Weights bit-exact, every command issued, no error; cycles equal to the simulator's unless the run
        was stalled (`exact_cycles=False`: then at least the simulator's, which times an unstalled run)."""
        expected = self.model.final_weights()
        wrong = [layer for layer in expected if weights.get(layer) != expected[layer]]
        result = {"label": label, "cycles_rtl": counters["cycles"], "ops_rtl": counters["ops"],
                  "link_error": counters["error"], "bit_exact": not wrong,
                  "run_wall_s": round(counters.get("run_wall_s", 0.0), 4),
                  "final": {str(k): v for k, v in weights.items()}}
        if "trace" in counters:
            result.update(measured_period(counters["trace"]) or {})
        path = os.environ.get("LAYERPIPE_RESULT")
        if path:
            with open(path, "w") as fh:
                json.dump(result, fh, sort_keys=True)
        assert counters["error"] == 0, f"{label}: a link queue overflowed"
        assert not wrong, f"{label}: final weights of layers {wrong} differ from the integer reference"
        assert counters["ops"] == self.model.ops, (
            f"{label}: {counters['ops']} PE commands issued, expected {self.model.ops}")
        if "trace" in counters:
            self.check_trace(counters["trace"], counters["link_traffic"], label, exact_cycles)
        if exact_cycles:
            assert counters["cycles"] == self.model.cycles, (
                f"{label}: {counters['cycles']} cycles, the simulator predicts {self.model.cycles}")
        else:
            assert counters["cycles"] >= self.model.cycles, (
                f"{label}: {counters['cycles']} stalled cycles, fewer than the simulator's {self.model.cycles}")


    def check_trace(self, ops: list[list[list[int]]], links: list[list[int]], label: str, exact_cycles: bool) -> None:
        """Each PE's (op, iteration, issue cycle) sequence against the simulator's op trace (order only when
        stalled), and each link's transfers and beats against the program's."""
        expected = self.model.doc["trace"]
        for p, (got, want) in enumerate(zip(ops, expected, strict=True)):
            if not exact_cycles:
                got, want = [op[:2] for op in got], [op[:2] for op in want]
            for k, (g, w) in enumerate(zip(got, want, strict=False)):
                assert g == w, (f"{label}: PE {p} op {k} is [entry, iteration, cycle] {g}, the simulator's trace "
                                f"says {w}")
            assert len(got) == len(want), f"{label}: PE {p} issued {len(got)} ops, the simulator {len(want)}"
        assert links == self.model.doc["link_traffic"], (
            f"{label}: link [transfers, beats] {links}, the program's {self.model.doc['link_traffic']}")


async def setup(dut: Any) -> tuple[Model, Driver, Monitor, Checker]:
    model = Model.load()
    Clock(dut.clk, 10, unit="ns").start()  # cocotb 2: the clock runs its own driver task
    driver = Driver(dut, model, random.Random(model.doc["seed"]))
    await driver.reset()
    return model, driver, Monitor(dut, model), Checker(model)


async def full_run(driver: Driver, monitor: Monitor, stall: float,
                   watch: CommandMonitor | None = None) -> tuple[dict[str, Any], dict]:
    """Load, stream, run, read back. With `watch` the passive monitors record the run (per-cycle Python: the
    plain case runs without them, so its wall time is the simulator's speed)."""
    await driver.load_weights()
    await driver.stream_samples(stall)
    if watch is not None:
        watch.start()
    began = time.perf_counter()
    await driver.start()
    await monitor.wait_done()
    counters: dict[str, Any] = {**monitor.counters(), "run_wall_s": time.perf_counter() - began}
    if watch is not None:
        watch.stop()
        counters.update(trace=watch.ops, link_traffic=watch.links)
    return counters, await monitor.read_weights()


@cocotb.test()
async def run_plain(dut: Any) -> None:
    """One run, samples streamed without stalls."""
    _, driver, monitor, checker = await setup(dut)
    counters, weights = await full_run(driver, monitor, 0.0)
    checker.check(counters, weights, "plain")


@cocotb.test()
async def run_monitored(dut: Any) -> None:
    """One run watched op by op: every PE's (op, iteration, issue cycle) equals the simulator's trace, every
    link carries the program's transfers and beats; then the final weights."""
    model, driver, monitor, checker = await setup(dut)
    counters, weights = await full_run(driver, monitor, 0.0, CommandMonitor(dut, model))
    checker.check(counters, weights, "monitored")


@cocotb.test()
async def run_stalled(dut: Any) -> None:
    """Random stalls on the sample stream (valid) and on every link (ready) during the run: the same weights;
    more cycles than the simulator's unstalled run."""
    model, driver, monitor, checker = await setup(dut)
    probability = float(os.environ.get("LAYERPIPE_STALL", "0.3"))
    await driver.load_weights()
    await driver.stream_samples(probability)
    links = len(model.doc.get("links", [])) or 1
    watch = CommandMonitor(dut, model)
    watch.start()
    stalls = cocotb.start_soon(driver.inject_link_stalls(probability, links))
    began = time.perf_counter()
    await driver.start()
    await monitor.wait_done(stalled=True)
    stalls.cancel()
    watch.stop()
    await FallingEdge(dut.clk)
    dut.link_stall.value = 0
    counters = {**monitor.counters(), "run_wall_s": time.perf_counter() - began, "trace": watch.ops,
                "link_traffic": watch.links}
    checker.check(counters, await monitor.read_weights(), "stalled", exact_cycles=False)


@cocotb.test()
async def run_reset_midway(dut: Any) -> None:
    """Reset at a random cycle of a run (seeded), then run again from the beginning: the undisturbed result."""
    model, driver, monitor, checker = await setup(dut)
    await driver.load_weights()
    await driver.stream_samples(0.0)
    await driver.start()
    await ClockCycles(dut.clk, driver.rng.randrange(1, max(2, model.cycles)))
    assert dut.done.value == 0, "the run should still be going"
    await driver.reset()
    counters, weights = await full_run(driver, monitor, 0.0, CommandMonitor(dut, model))
    checker.check(counters, weights, "reset")


@cocotb.test()
async def run_back_to_back(dut: Any) -> None:
    """Two runs without a reset between them (weights reloaded, samples streamed again): the second start
    clears the arrival, command and cycle counters, so both runs are bit-exact and cycle-exact."""
    model, driver, monitor, checker = await setup(dut)
    for label in ("first", "second"):
        counters, weights = await full_run(driver, monitor, 0.0, CommandMonitor(dut, model))
        checker.check(counters, weights, label)


@cocotb.test()
async def run_protocol(dut: Any) -> None:
    """The host protocol is guarded: a sample word offered during a run, or past max_samples, sets error."""
    model, driver, monitor, _ = await setup(dut)
    await driver.load_weights()
    await driver.stream_samples(0.0)
    assert dut.error.value == 0
    if model.samples == model.doc.get("max_samples", model.samples):
        await driver.offer_word()  # the sample memory is full
        assert dut.error.value == 1, "a word past max_samples must set error"
        await driver.reset()
        await driver.load_weights()
        await driver.stream_samples(0.0)
    await driver.start()
    await driver.offer_word()  # during the run
    assert dut.error.value == 1, "a word offered during a run must set error"
    await monitor.wait_done()
