"""Whole-accelerator cocotb bench, part of the package so `layerpipe verify` runs from a wheel (launched by
`layerpipe.hdl._flow.run_bench` through cocotb_tools.runner).

Roles are kept apart:
- `Model`   — the expected behaviour, read from the vectors file pytest wrote (integer PyTorch reference for the
              weights, the Python simulator for the cycle count); no computation of its own;
- `Host`    — the host interface's bus protocol (hdl/_host.py): CSR writes and reads by register name (the map
              comes from the vectors file), words as stream beats in (random valid gaps) and out (random
              ready-low);
- `Driver`  — drives the host side: loads initial weights, streams the samples (x, target) into the sample
              rings before and during the run, starts a run, resets in the middle of one;
- `Monitor` — observes: waits for done, reads the cycle and op counters and reads back every weight;
- `CommandMonitor` — passive, per cycle: each PE's issued ops (entry, iteration, cycle) and each link's beats;
- `Checker` — compares what the monitors saw with the model (final weights, cycles, the simulator's op trace
              op by op, the program's link traffic) and writes the observation to a result file.

Inputs are driven and outputs sampled on the falling clock edge, so every value is stable when looked at.
Environment: LAYERPIPE_VECTORS (vectors JSON), LAYERPIPE_RESULT (where to write the observation, optional),
LAYERPIPE_STALL (probability that the input stream's valid is low, the output stream's ready is low and each
link's ready is low, in a cycle; default 0.3 for the stall tests).
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
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge

#: hdl/_host.py's CTRL and STATUS bits (the bench runs from a wheel without importing amaranth).
CTRL_START, CTRL_CLEAR, CTRL_READ = 1, 2, 4
STATUS_BUSY, STATUS_DONE, STATUS_ERROR = 1, 2, 4


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


class Host:
    """The host interface's protocol: CSR chunks and stream beats, driven and sampled on the falling edge."""

    def __init__(self, dut: Any, model: Model, rng: random.Random) -> None:
        self.dut = dut
        self.map = model.doc["host"]
        self.rng = rng
        self.csr_bits = self.map["csr_bits"]
        self.stream_bits = self.map["stream_bits"]
        self.beats = self.map["beats_per_word"]
        self.word_bits = model.lanes * model.bits

    def _chunks(self, name: str) -> tuple[int, int]:
        address, width, _ = self.map["registers"][name]
        return address, -(-width // self.csr_bits)

    async def write(self, name: str, value: int) -> None:
        dut, (address, chunks) = self.dut, self._chunks(name)
        mask = (1 << self.csr_bits) - 1
        for k in range(chunks):
            await FallingEdge(dut.clk)
            dut.csr_addr.value = address + k
            dut.csr_wdata.value = (value >> (k * self.csr_bits)) & mask
            dut.csr_we.value = 1
        await FallingEdge(dut.clk)
        dut.csr_we.value = 0

    async def read(self, name: str) -> int:
        """The register's value; `csr_rdata` follows `csr_addr` by one cycle (chunks read back to back)."""
        dut, (address, chunks) = self.dut, self._chunks(name)
        value = 0
        await FallingEdge(dut.clk)
        dut.csr_addr.value = address
        for k in range(chunks):
            await FallingEdge(dut.clk)
            value |= int(dut.csr_rdata.value) << (k * self.csr_bits)
            if k + 1 < chunks:
                dut.csr_addr.value = address + k + 1
        return value

    def beats_of(self, words: list[int]) -> list[int]:
        mask = (1 << self.stream_bits) - 1
        return [(word >> (b * self.stream_bits)) & mask for word in words for b in range(self.beats)]

    async def send(self, words: list[int], gaps: float = 0.0) -> None:
        """Every word as beats on `stream_in`: before a beat, valid stays low for a cycle with probability `gaps`;
        a beat offered is held until `ready` (back-pressure from a full sample ring or a run)."""
        dut = self.dut
        for beat in self.beats_of(words):
            while True:
                await FallingEdge(dut.clk)
                if self.rng.random() >= gaps:
                    break
                dut.stream_in__valid.value = 0
            dut.stream_in__payload.value = beat
            dut.stream_in__valid.value = 1
            while dut.stream_in__ready.value != 1:  # taken at the rising edge after a falling edge with ready
                await FallingEdge(dut.clk)
        await FallingEdge(dut.clk)
        dut.stream_in__valid.value = 0

    async def offer(self, beat: int) -> None:
        """One beat offered for one cycle whether taken or not (a protocol probe)."""
        await FallingEdge(self.dut.clk)
        self.dut.stream_in__payload.value = beat
        self.dut.stream_in__valid.value = 1
        await FallingEdge(self.dut.clk)
        self.dut.stream_in__valid.value = 0

    async def receive(self, count: int, stalls: float = 0.0) -> list[int]:
        """`count` words from `stream_out`; ready is low in a cycle with probability `stalls`."""
        dut, word, k = self.dut, 0, 0
        beats: list[int] = []
        words: list[int] = []
        while len(beats) < count * self.beats:
            await FallingEdge(dut.clk)
            ready = self.rng.random() >= stalls
            dut.stream_out__ready.value = int(ready)
            if ready and dut.stream_out__valid.value == 1:  # taken at the coming rising edge
                beats.append(int(dut.stream_out__payload.value))
        await FallingEdge(dut.clk)
        dut.stream_out__ready.value = 0
        for beat in beats:
            word |= beat << (k * self.stream_bits)
            k += 1
            if k == self.beats:
                words.append(word & ((1 << self.word_bits) - 1))
                word, k = 0, 0
        return words


class Driver:
    def __init__(self, dut: Any, model: Model, rng: random.Random) -> None:
        self.dut = dut
        self.model = model
        self.rng = rng
        self.host = Host(dut, model, rng)

    async def reset(self, cycles: int = 2) -> None:
        dut = self.dut
        await FallingEdge(dut.clk)
        dut.rst.value = 1
        dut.csr_we.value = 0
        dut.stream_in__valid.value = 0
        dut.stream_out__ready.value = 0
        if hasattr(dut, "link_stall"):  # the debug top's stall injector (run_plain also runs on the real top)
            dut.link_stall.value = 0
        await ClockCycles(dut.clk, cycles, rising=False)
        dut.rst.value = 0

    async def load_weights(self, gaps: float = 0.0) -> None:
        lanes, bits = self.model.lanes, self.model.bits
        await self.host.write("MODE", 1)
        for layer in self.model.doc["layers"]:
            # The owner's ring and every received copy (PEs running F / E away from the owner) hold version 0.
            for pe, base in [[layer["pe"], layer["init_addr"]], *layer.get("copies", [])]:
                await self.host.write("PE", pe)
                await self.host.write("ADDR", base)  # the rows are consecutive words from here
                await self.host.send([w for row in layer["init"] for w in words_of(row, lanes, bits)], gaps)
        await self.host.write("MODE", 0)

    def sample_words(self) -> list[list[int]]:
        """Per iteration t, x(t)'s words then y(t)'s (B samples each)."""
        lanes, bits = self.model.lanes, self.model.bits
        batch = self.model.doc.get("batch", 1)
        xs, ys = self.model.doc["x"], self.model.doc["y"]
        out = []
        for t in range(0, len(xs), batch):  # iteration t: its micro-batch's x rows, then their y rows
            words = [w for x in xs[t:t + batch] for w in words_of(x, lanes, bits)]
            out.append(words + [w for y in ys[t:t + batch] for w in words_of(y, lanes, bits)])
        return out

    async def stream_samples(self, gaps: float) -> None:
        """All T iterations' samples, x(t) words then y(t) words; the sample rings take D ahead of the run, the
        rest while it runs (back-pressure in between)."""
        for words in self.sample_words():
            await self.host.send(words, gaps)

    async def run(self, gaps: float = 0.0) -> Any:
        """Set T, stream the samples in the background and start once the rings are full (a host that keeps
        up): the streaming task is returned (it ends when the run has taken the last sample)."""
        await self.host.write("SAMPLES", self.model.samples)
        feeder = cocotb.start_soon(self.stream_samples(gaps))
        ahead = min(self.model.samples, self.model.doc["host"]["sample_depth"])
        while await self.host.read("LOADED") < ahead:
            pass
        await self.host.write("CTRL", CTRL_START)
        return feeder

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


class Monitor:
    def __init__(self, dut: Any, model: Model, host: Host) -> None:
        self.dut = dut
        self.model = model
        self.host = host

    async def wait_done(self, stalled: bool = False) -> None:
        """Polls STATUS every 32 cycles (the cycle counter stops at the run's end, so the poll's lag does not
        show): 5× the simulator's cycles (20× with stalls injected), plus a margin."""
        limit = (20 if stalled else 5) * self.model.cycles + 1000
        waited = 0
        while not await self.host.read("STATUS") & STATUS_DONE:
            assert waited < limit, f"no done after {waited} cycles"
            await ClockCycles(self.dut.clk, 32, rising=False)
            waited += 32

    async def counters(self) -> dict[str, int]:
        error = bool(await self.host.read("STATUS") & STATUS_ERROR)
        return {"cycles": await self.host.read("CYCLES"), "ops": await self.host.read("OPS"), "error": int(error)}

    async def read_weights(self, stalls: float = 0.0) -> dict[int, list[list[int]]]:
        """Every layer's final weights, streamed out (`ready` low with probability `stalls` in a cycle)."""
        lanes, bits = self.model.lanes, self.model.bits
        out: dict[int, list[list[int]]] = {}
        for layer in self.model.doc["layers"]:
            await self.host.write("PE", layer["pe"])
            await self.host.write("ADDR", layer["final_addr"])
            await self.host.write("COUNT", layer["rows"] * layer["row_words"])
            await self.host.write("CTRL", CTRL_READ)
            words = await self.host.receive(layer["rows"] * layer["row_words"], stalls)
            rows = []
            for r in range(layer["rows"]):
                row: list[int] = []
                for word in words[r * layer["row_words"]:(r + 1) * layer["row_words"]]:
                    row += unpack(word, lanes, bits)
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
        # Each PE's valid and each link's beat are read through `activity` (PE p at bit p, link k at bit P + k):
        # one read in an idle cycle; the other taps only when their bit is set.
        taps = [(getattr(dut, f"trace{p}_entry"), getattr(dut, f"trace{p}_iter")) for p in range(self.num_pes)]
        lasts = [getattr(dut, f"link{k}_last") for k in range(self.num_links)]
        activity = dut.activity
        pes = self.num_pes
        wide = len(activity) > 1  # a one-bit port reads as a Logic, a wider one as a LogicArray
        while True:
            await FallingEdge(dut.clk)  # comb taps of this cycle, stable half a cycle before its edge
            active = activity.value.to_unsigned() if wide else int(activity.value)
            if not active:
                continue
            for p, (entry, iteration) in enumerate(taps):
                if active >> p & 1:
                    self.ops[p].append([int(entry.value), int(iteration.value), int(dut.cycles.value)])
            for k, last in enumerate(lasts):
                if active >> (pes + k) & 1:
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
    Clock(dut.clk, 10, unit="ns", impl="gpi").start()  # toggled in C by the GPI, no Python task per edge
    driver = Driver(dut, model, random.Random(model.doc["seed"]))
    await driver.reset()
    return model, driver, Monitor(dut, model, driver.host), Checker(model)


async def full_run(driver: Driver, monitor: Monitor, stall: float = 0.0, watch: CommandMonitor | None = None,
                   stalled: bool = False) -> tuple[dict[str, Any], dict]:
    """Load, stream (the rings filled before the start, refilled during the run), run, read back; `stall`: the
    host's random valid gaps and ready-low on the read-out. With `watch` the passive monitors record the run."""
    await driver.load_weights(stall)
    if watch is not None:
        watch.start()
    began = time.perf_counter()
    feeder = await driver.run(stall)
    await monitor.wait_done(stalled)
    counters: dict[str, Any] = {**await monitor.counters(), "run_wall_s": time.perf_counter() - began}
    await feeder
    if watch is not None:
        watch.stop()
        counters.update(trace=watch.ops, link_traffic=watch.links)
    return counters, await monitor.read_weights(stall)


def stall_probability() -> float:
    return float(os.environ.get("LAYERPIPE_STALL", "0.3"))


@cocotb.test()
async def run_plain(dut: Any) -> None:
    """One run, samples streamed without stalls."""
    _, driver, monitor, checker = await setup(dut)
    counters, weights = await full_run(driver, monitor)
    checker.check(counters, weights, "plain")


@cocotb.test()
async def run_monitored(dut: Any) -> None:
    """One run watched op by op: every PE's (op, iteration, issue cycle) equals the simulator's trace, every
    link carries the program's transfers and beats; then the final weights."""
    model, driver, monitor, checker = await setup(dut)
    counters, weights = await full_run(driver, monitor, 0.0, CommandMonitor(dut, model))
    checker.check(counters, weights, "monitored")


@cocotb.test()
async def run_host_stalls(dut: Any) -> None:
    """Back-pressure from the host side only: random valid gaps on the input stream (weights and samples) and
    ready-low on the weight read-out. The same weights; at least the simulator's cycles (exactly them while the
    gaps leave the rings full)."""
    model, driver, monitor, checker = await setup(dut)
    counters, weights = await full_run(driver, monitor, stall_probability(), CommandMonitor(dut, model), True)
    checker.check(counters, weights, "host stalls", exact_cycles=False)


@cocotb.test()
async def run_stalled(dut: Any) -> None:
    """Random stalls on the host's streams and on every link (ready) during the run: the same weights; more cycles
    than the simulator's unstalled run."""
    model, driver, monitor, checker = await setup(dut)
    probability = stall_probability()
    links = len(model.doc.get("links", [])) or 1
    stalls = cocotb.start_soon(driver.inject_link_stalls(probability, links))
    counters, weights = await full_run(driver, monitor, probability, CommandMonitor(dut, model), True)
    stalls.cancel()
    await FallingEdge(dut.clk)
    dut.link_stall.value = 0
    checker.check(counters, weights, "stalled", exact_cycles=False)


@cocotb.test()
async def run_reset_midway(dut: Any) -> None:
    """Reset at a random cycle of a run (seeded), then run again from the beginning: the undisturbed result."""
    model, driver, monitor, checker = await setup(dut)
    await driver.load_weights()
    feeder = await driver.run()
    await ClockCycles(dut.clk, driver.rng.randrange(1, max(2, model.cycles)))
    assert not await driver.host.read("STATUS") & STATUS_DONE, "the run should still be going"
    feeder.cancel()
    await driver.reset()
    counters, weights = await full_run(driver, monitor, 0.0, CommandMonitor(dut, model))
    checker.check(counters, weights, "reset")


@cocotb.test()
async def run_back_to_back(dut: Any) -> None:
    """Two runs without a reset between them (weights reloaded, samples streamed again): the second start
    clears the arrival, command and cycle counters, the end of the first rewound the sample loader, so both
    runs are bit-exact and cycle-exact."""
    model, driver, monitor, checker = await setup(dut)
    for label in ("first", "second"):
        counters, weights = await full_run(driver, monitor, 0.0, CommandMonitor(dut, model))
        checker.check(counters, weights, label)


@cocotb.test()
async def run_protocol(dut: Any) -> None:
    """The host protocol is guarded (ERROR, cleared by CLEAR): a sample word past the run's T, a START with T
    beyond MAX_SAMPLES (which does not start), a READ during a run; back-pressure from a full ring is not an
    error. After a CLEAR the next run is bit-exact and cycle-exact."""
    model, driver, monitor, checker = await setup(dut)
    host = driver.host
    first = driver.sample_words()[0]

    async def error() -> bool:
        return bool(await host.read("STATUS") & STATUS_ERROR)

    await host.write("SAMPLES", 1)
    await host.send(first)
    assert not await error()
    await host.offer(0)  # a word past T = 1
    assert await error(), "a sample word past the run's T must set error"
    await host.write("CTRL", CTRL_CLEAR)
    assert not await error(), "CLEAR clears error"
    assert await host.read("LOADED") == 0, "CLEAR rewinds the sample loader"
    max_samples = await host.read("MAX_SAMPLES")
    assert max_samples == model.doc["max_samples"]
    if max_samples + 1 < 1 << model.doc["host"]["registers"]["SAMPLES"][1]:
        await host.write("SAMPLES", max_samples + 1)
        await host.write("CTRL", CTRL_START)
        assert await error(), "a start with T beyond max_samples must set error"
        assert not await host.read("STATUS") & STATUS_BUSY, "and must not start a run"
        await host.write("CTRL", CTRL_CLEAR)
    await driver.load_weights()
    feeder = await driver.run()
    await host.write("CTRL", CTRL_READ)  # a read-out during the run
    assert await error(), "a READ during a run must set error"
    await monitor.wait_done()
    await feeder
    await host.write("CTRL", CTRL_CLEAR)
    counters, weights = await full_run(driver, monitor)
    checker.check(counters, weights, "after clear")
