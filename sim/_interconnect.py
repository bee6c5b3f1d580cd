"""Interconnect models and the simulator's configuration (contract 2).

Two models, chosen by `SimConfig.interconnect`:

- ``shared``: processors share one memory. Data an op produces is available to every consumer the
  cycle its producer ends; moving it costs nothing (traffic is still counted, as words that cross
  processors).
- ``links``: one point-to-point link per ordered processor pair p→q. Every (producer op, consumer op)
  pair on different processors is one transfer of w words (the sum of the DFG edges between the two
  ops). The transfer

  * may start when the producer op ends and the link p→q is free,
  * holds the link for ``ceil(w / words_per_cycle)`` cycles (0 for w = 0),
  * arrives ``latency`` cycles after it leaves the link:
    ``arrival = depart + ceil(w / words_per_cycle) + latency``.

  Transfers queue on their link in order of producer end time; transfers whose producers end in the
  same cycle go in consumer order (the consumer's processor, then its position in that processor's
  program). The link is free again at ``depart + ceil(w / words_per_cycle)``: the latency is a
  pipeline, not an occupancy.

- ``bus``: one medium for every transfer (`layerpipe.interconnect`); the same timing as ``links`` with a
  single channel, timed by the event-driven engine. It is compiled where the run has a plan to follow
  (`layerpipe.sim._engine.bus_order`): a planned run's transfers leave in the plan's order and no earlier than
  the plan's bus sends them; a synchronous run's step after step in step 0's order. Otherwise transfers
  queue in order of producer end time across all processors (ties in consumer order).

The three kinds are `layerpipe.interconnect.Interconnect`'s (the one model the schedulers, the reports and
the RTL's cost model share); `SimConfig.of(interconnect)` builds a configuration from one and
`SimConfig.model` gives it back. Bandwidths may be fractions (`Fraction(1, 16)`: 16 cycles per word).

Same-processor data is free in every model. ``links`` with ``latency=0`` and
``words_per_cycle=math.inf`` times exactly like ``shared`` (a property the tests check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from layerpipe.errors import InputError
from layerpipe.interconnect import SHARED, Interconnect, as_fraction
from layerpipe.schedule._engine import link_hold_cycles  # the engine's one rule of a transfer's hold

__all__ = ["INTERCONNECTS", "MODES", "SimConfig", "link_hold_cycles"]

INTERCONNECTS: tuple[str, ...] = ("shared", "links", "bus")
MODES: tuple[str, ...] = ("stash", "latest", "ema")


@dataclass(frozen=True)
class SimConfig:
    """How the simulator times transfers and which weight mode the memory and version reports assume.

    `mode` is the weight mode of design notes §3: `stash` (E reads the version its F read; the versions
    in flight are held), `latest` (E reads the current version) or `ema` (E reads the current weights
    corrected by a moving-average buffer of |W_l| words per layer).
    """

    interconnect: str = "shared"
    link_latency: int = 0
    link_words_per_cycle: float | Fraction = 1
    mode: str = "stash"
    label: str = ""  #: the interconnect's spec as the user spelled it (`rtl`), for reports

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise InputError(f"interconnect '{self.interconnect}' is not one of {', '.join(INTERCONNECTS)}")
        if self.mode not in MODES:
            raise InputError(f"mode '{self.mode}' is not one of {', '.join(MODES)}")
        if not isinstance(self.link_latency, int) or self.link_latency < 0:
            raise InputError(f"link_latency must be an integer >= 0 cycles, got {self.link_latency!r}")
        wpc = self.link_words_per_cycle
        if isinstance(wpc, bool) or not isinstance(wpc, (int, float, Fraction)) or not wpc > 0:
            raise InputError(f"link_words_per_cycle must be > 0 words per cycle, got {wpc!r}")
        if isinstance(wpc, Fraction) and wpc.denominator == 1:
            object.__setattr__(self, "link_words_per_cycle", int(wpc))

    @staticmethod
    def links(latency: int, words_per_cycle: float | Fraction = 1, mode: str = "stash") -> SimConfig:
        return SimConfig("links", latency, words_per_cycle, mode)

    @staticmethod
    def of(interconnect: Interconnect, mode: str = "stash") -> SimConfig:
        """The simulator's configuration for an interconnect of `layerpipe.interconnect`."""
        if interconnect.is_shared:
            return SimConfig("shared", mode=mode, label=interconnect.label)
        assert interconnect.words_per_cycle is not None
        return SimConfig(interconnect.kind, interconnect.latency, interconnect.words_per_cycle, mode,
                         interconnect.label)

    @property
    def model(self) -> Interconnect:
        """This configuration's interconnect as the shared model (infinite bandwidth has no such form)."""
        if self.interconnect == "shared":
            return SHARED
        w = as_fraction(self.link_words_per_cycle)
        text = str(w.numerator) if w.denominator == 1 else f"{w.numerator}/{w.denominator}"
        label = self.label or f"{self.interconnect}:{self.link_latency}:{text}"
        return Interconnect(self.interconnect, self.link_latency, w, label)

    def hold_cycles(self, words: int) -> int:
        """Cycles a transfer of `words` occupies its link."""
        return link_hold_cycles(words, self.link_words_per_cycle)

    def describe(self) -> dict[str, object]:
        """The configuration as JSON-ready fields (metrics.json)."""
        doc: dict[str, object] = {"interconnect": self.interconnect, "mode": self.mode}
        if self.label:
            doc["interconnect_spec"] = self.label
        if self.interconnect != "shared":
            wpc = self.link_words_per_cycle
            doc["link_latency_cycles"] = self.link_latency
            doc["link_words_per_cycle"] = ("inf" if wpc == math.inf else
                                           f"{wpc.numerator}/{wpc.denominator}" if isinstance(wpc, Fraction) else wpc)
        return doc
