"""The interconnect model shared by the schedulers, the simulator, the reports and the RTL's cost model
(design notes §11).

A transfer of v words from processor p to processor q leaves after its producer ends, holds its channel
⌈v / w⌉ cycles (w words per cycle, possibly a fraction such as 1/16) and arrives `latency` cycles after it
left the channel. Kinds, spelled on the command line as `--interconnect SPEC`:

| spec                      | channels                                  | meaning                                  |
|---------------------------|-------------------------------------------|------------------------------------------|
| `shared`                  | none                                      | data arrives when its producer ends      |
| `links:LATENCY:W`         | one per ordered pair p→q                  | point-to-point links                     |
| `bus:LATENCY:W`           | one for every transfer                    | one shared medium                        |
| `rtl`                     | one per ordered pair, W = lanes, L = 2    | the links `layerpipe rtl` generates      |

W is a positive integer or a fraction `a/b` (`1/16`: a 16-cycle hold per word, a GPU-like compute:link
ratio). `shared` is an idealisation, never a silent default: results name their interconnect.
Data between tasks on one processor never uses a channel. A channel carries one transfer at a
time; the latency is a pipeline, not an occupancy, so a channel is free again ⌈v / w⌉ cycles after a
transfer left it. In a periodic schedule every channel's occupancy per period must fit in the period:
the period is bounded below by the busiest channel as well as by the busiest processor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from layerpipe.errors import InputError

#: Interconnect kinds, in the order the help text lists them.
KINDS: tuple[str, ...] = ("shared", "links", "bus", "rtl")
#: The forms a spec may take, for error messages.
FORMS = "shared, links:LATENCY:WORDS_PER_CYCLE, bus:LATENCY:WORDS_PER_CYCLE or rtl"
#: Cycles from the last beat leaving a generated link to the consumer seeing it (`layerpipe.hdl._link`).
RTL_LINK_LATENCY = 2
#: Largest latency a spec may name (cycles): beyond any interconnect these models describe.
MAX_LATENCY = 10**9
#: Bound on the numerator and denominator of a bandwidth: keeps ⌈v·b/a⌉ exact and cheap.
MAX_BANDWIDTH_TERM = 10**9


@dataclass(frozen=True)
class Interconnect:
    """How data moves between processors.

    `kind` is `shared`, `links` or `bus` (`rtl` is `links` with the hardware's parameters; `label` keeps the
    spelling the user chose, so reports name it as given). `words_per_cycle` is None for `shared`.
    """

    kind: str = "shared"
    latency: int = 0
    words_per_cycle: Fraction | None = None
    label: str = "shared"

    def __post_init__(self) -> None:
        if self.kind not in ("shared", "links", "bus"):
            raise InputError(f"interconnect kind '{self.kind}' is not one of shared, links, bus")
        if self.kind == "shared":
            if self.latency or self.words_per_cycle is not None:
                raise InputError("interconnect 'shared' has no latency or bandwidth")
            return
        if isinstance(self.latency, bool) or not isinstance(self.latency, int) or not 0 <= self.latency <= MAX_LATENCY:
            raise InputError(f"interconnect latency must be an integer in 0..{MAX_LATENCY} cycles, "
                             f"got {self.latency!r}")
        w = self.words_per_cycle
        if not isinstance(w, Fraction) or w <= 0:
            raise InputError(f"interconnect words per cycle must be a positive number, got {w!r}")

    # ------------------------------------------------------------------------------------ constructors

    @staticmethod
    def links(latency: int, words_per_cycle: int | Fraction | str = 1) -> Interconnect:
        w = _bandwidth(str(words_per_cycle), f"links:{latency}:{words_per_cycle}")
        return Interconnect("links", latency, w, f"links:{latency}:{_fraction_text(w)}")

    @staticmethod
    def bus(latency: int, words_per_cycle: int | Fraction | str = 1) -> Interconnect:
        w = _bandwidth(str(words_per_cycle), f"bus:{latency}:{words_per_cycle}")
        return Interconnect("bus", latency, w, f"bus:{latency}:{_fraction_text(w)}")

    @staticmethod
    def rtl(lanes: int) -> Interconnect:
        """The generated hardware's links: `lanes` words per cycle, latency `RTL_LINK_LATENCY`."""
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise InputError(f"interconnect 'rtl' needs lanes >= 1 (--lanes), got {lanes!r}")
        return Interconnect("links", RTL_LINK_LATENCY, Fraction(lanes), "rtl")

    # ------------------------------------------------------------------------------------------- timing

    @property
    def is_shared(self) -> bool:
        return self.kind == "shared"

    def hold(self, words: int) -> int:
        """Cycles a transfer of `words` occupies its channel: ⌈words / words_per_cycle⌉ (0 for none)."""
        if words <= 0 or self.words_per_cycle is None:
            return 0
        w = self.words_per_cycle
        return -(-(words * w.denominator) // w.numerator)

    def transfer_cycles(self, words: int) -> int:
        """Producer end to arrival for an uncontended transfer: hold + latency (0 on `shared`)."""
        if self.is_shared:
            return 0
        return self.hold(words) + self.latency

    def channel(self, src: int, dst: int, num_procs: int) -> int:
        """The channel a transfer p→q uses: link p·N + q, or 0 for the bus."""
        return 0 if self.kind == "bus" else src * num_procs + dst

    def num_channels(self, num_procs: int) -> int:
        return 0 if self.is_shared else (1 if self.kind == "bus" else num_procs * num_procs)

    # -------------------------------------------------------------------------------------- describing

    @property
    def spec(self) -> str:
        """The spec text this interconnect parses from (the user's spelling for `rtl`)."""
        return self.label

    def resolved(self) -> str:
        """The spec with `rtl` spelled out: `rtl (links:2:4)`."""
        if self.label == "rtl":
            return f"rtl (links:{self.latency}:{_fraction_text(self.words_per_cycle)})"
        return self.label

    def describe(self) -> dict[str, object]:
        """JSON-ready fields: spec, kind, latency_cycles, words_per_cycle (a string for fractions)."""
        doc: dict[str, object] = {"spec": self.label, "kind": self.kind}
        if not self.is_shared:
            doc["latency_cycles"] = self.latency
            doc["words_per_cycle"] = _fraction_text(self.words_per_cycle)
        return doc

    def __str__(self) -> str:
        return self.resolved()


SHARED = Interconnect()

#: A compiled bus's order of one transfer (`compiled_bus_key`): comparable tuples of planned times and ranks.
BusKey = tuple[int, int, int, int, tuple[int, int, int], int]


def compiled_bus_key(release: int, producer_start: int, consumer_proc: int, consumer_start: int,
                     consumer_rank: tuple[int, int, int], producer_proc: int) -> BusKey:
    """The order a compiled bus serves a periodic plan's transfers in: planned release (the producer's planned
    end), then the producer that started first, then the consumer's processor, its planned start and its tie
    rank (`layerpipe.schedule._ir.tie_rank`), then the producer's processor.

    The one definition of that order: the scheduler packs a bus around the period in it
    (`layerpipe.schedule._comm.channel_timing`, times taken in the window of the release) and the simulator
    serves a planned run's bus in it (`layerpipe.sim._engine`, absolute planned times); only differences of
    times matter, so both frames give the same order.
    """
    return (release, producer_start, consumer_proc, consumer_start, consumer_rank, producer_proc)


def parse_interconnect(spec: str, lanes: int | None = None, field: str = "--interconnect") -> Interconnect:
    """An interconnect from its spec (see the module docstring). `lanes` resolves `rtl`."""
    text = spec.strip() if isinstance(spec, str) else ""
    parts = text.split(":")
    kind = parts[0]
    if kind == "shared" and len(parts) == 1:
        return SHARED
    if kind == "rtl" and len(parts) == 1:
        if lanes is None:
            raise InputError(f"{field} 'rtl' needs the PE lanes (--lanes)")
        return Interconnect.rtl(lanes)
    if kind in ("links", "bus"):
        if len(parts) != 3:
            raise InputError(f"{field} '{spec}': {kind} needs {kind}:LATENCY:WORDS_PER_CYCLE, e.g. {kind}:2:16 "
                             f"or {kind}:2:1/16")
        latency_text, w_text = parts[1], parts[2]
        if not latency_text.isdigit() or int(latency_text) > MAX_LATENCY:
            raise InputError(f"{field} '{spec}': LATENCY must be an integer in 0..{MAX_LATENCY} cycles, "
                             f"got '{latency_text}'")
        w = _bandwidth(w_text, spec, field)
        return Interconnect(kind, int(latency_text), w, f"{kind}:{int(latency_text)}:{_fraction_text(w)}")
    raise InputError(f"{field} '{spec}' is not one of the forms {FORMS}")


def _bandwidth(text: str, spec: str, field: str = "--interconnect") -> Fraction:
    """A positive integer or fraction a/b of words per cycle."""
    allowed = "a positive integer or a fraction a/b such as 1/16"
    num, slash, den = text.partition("/")
    if not num.isdigit() or (slash and not den.isdigit()):
        raise InputError(f"{field} '{spec}': WORDS_PER_CYCLE must be {allowed}, got '{text}'")
    a, b = int(num), int(den) if slash else 1
    if b == 0:
        raise InputError(f"{field} '{spec}': WORDS_PER_CYCLE '{text}' divides by zero; it must be {allowed}")
    if a == 0:
        raise InputError(f"{field} '{spec}': WORDS_PER_CYCLE must be > 0 ({allowed}), got '{text}'")
    if a > MAX_BANDWIDTH_TERM or b > MAX_BANDWIDTH_TERM:
        raise InputError(f"{field} '{spec}': WORDS_PER_CYCLE terms must be <= {MAX_BANDWIDTH_TERM}, got '{text}'")
    return Fraction(a, b)


def _fraction_text(w: Fraction | None) -> str:
    if w is None:
        return "inf"
    return str(w.numerator) if w.denominator == 1 else f"{w.numerator}/{w.denominator}"


def as_fraction(value: float | int | Fraction) -> Fraction:
    """A bandwidth given as a number (the simulator's older `link_words_per_cycle`) as an exact fraction."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if math.isinf(value):
        raise InputError("an infinite bandwidth is the 'shared' interconnect")
    return Fraction(value).limit_denominator(MAX_BANDWIDTH_TERM)
