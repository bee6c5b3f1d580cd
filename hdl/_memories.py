"""The memories of an elaborated design and their ports: what block RAM mapping depends on.

ECP5's DP16KD and iCE40's SB_RAM40_4K take one write port; yosys keeps a memory with more in flip-flops (and
their read multiplexers in LUTs), which is how the free-placement design once overflowed an LFE5U-85F. The PE
therefore gives every link receiver that writes weights, gradients or bank 0 a memory of its own
(`hdl/_pe.py`, "One write port per memory"); `memory_ports` lets the tests pin that on generated designs
without running yosys.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Elaboratable, Fragment, Shape
from amaranth.hdl._mem import MemoryInstance

__all__ = ["MemoryPorts", "memory_ports"]


@dataclass(frozen=True)
class MemoryPorts:
    """One memory of the design: its hierarchical name, shape and port counts."""

    name: str  #: submodule path, e.g. "pe0.weights_in0"
    width: int
    depth: int
    read_ports: int
    write_ports: int

    @property
    def bits(self) -> int:
        return self.width * self.depth


def memory_ports(top: Elaboratable) -> list[MemoryPorts]:
    """Every memory of `top` after elaboration, in hierarchy order."""
    out: list[MemoryPorts] = []

    def walk(fragment: Fragment, path: str) -> None:
        if isinstance(fragment, MemoryInstance):
            data = fragment._data
            out.append(MemoryPorts(path, Shape.cast(data.shape).width, data.depth, len(fragment._read_ports),
                                   len(fragment._write_ports)))
        for sub, name, _ in fragment.subfragments:
            walk(sub, f"{path}.{name}" if path else str(name))

    walk(Fragment.get(top, None), "")
    return out
