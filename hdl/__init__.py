"""The Amaranth RTL of the layerpipe training accelerator, imported as `layerpipe.hdl`.

Processing element (`ProcessingElement`, configured by `PEConfig`, commanded by `PEOp`): local memories of
wide words (`lanes` fixed-point elements each), an op engine running one F/A/E/G/U command at a time on
`lanes` multipliers, with a closed cycle formula (`op_cycles`, the `rtl` cost model `RTLCostModel`).
See `hdl/_pe.py` for the memory layout, the command table and the timing contract.

Tooling: `component_verilog` (one component's Verilog, deterministic; a whole design's is
`layerpipe.export_verilog`), `lint_verilog` (Verilator, documented waivers), `synthesize` (yosys generic /
iCE40 figures), `run_cocotb` (cocotb benches on Icarus or Verilator, toolchain facts in one place).

Whole accelerator (see hdl/README.md): `make_design` schedules an MLP with a policy under the `rtl` cost model
and compiles it (`compile_program` → `Program`: per-PE microcode and memory maps); `Accelerator` is the top
level (N PEs, sequencers, ready/valid links, host ports, trace taps) and runs any placement of a layer's
tasks over the PEs, in micro-batches; `rtl_sim_config(lanes)` is the simulator configuration (the `rtl`
interconnect) under which `layerpipe.sim` is cycle-exact with it. `_model.run_program` executes a compiled
program in Python op by op; `cocotb_accel` is the whole-accelerator bench.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerpipe._lazy import lazy_names

if TYPE_CHECKING:
    from layerpipe._rtl_costs import RTLCostModel
    from layerpipe.hdl._cocotb import SIMULATORS, CocotbResult, available_simulators, run_cocotb, verilator_environment
    from layerpipe.hdl._compiler import SUPPORTED_POLICIES, compile_program
    from layerpipe.hdl._datapath import Opcode
    from layerpipe.hdl._flow import Design, make_design
    from layerpipe.hdl._link import LINK_LATENCY
    from layerpipe.hdl._pe import (
        MAX_DEPTH,
        MAX_DIM,
        MAX_LANES,
        PEConfig,
        PEOp,
        ProcessingElement,
        VectorAddr,
        command_layout,
        op_cycles,
        op_overhead,
        pack_matrix,
        pack_vector,
        unpack_matrix,
        unpack_vector,
    )
    from layerpipe.hdl._program import HardwareLimits, Program
    from layerpipe.hdl._synth import (
        LINT_WAIVERS,
        SYNTH_TARGETS,
        LintResult,
        lint_verilog,
        synthesize,
        synthesize_design,
    )
    from layerpipe.hdl._top import Accelerator, rtl_sim_config
    from layerpipe.hdl._verilog import component_verilog

#: Public name → the module that defines it, imported on first use (PEP 562). Importing a submodule imports this
#: package first: the cocotb bench (`layerpipe.hdl.cocotb_accel`, loaded in every simulator process) needs none of
#: these, and eager imports (amaranth, networkx, the compiler) cost each Icarus or Verilator run ~0.26 s of CPU.
_LAZY: dict[str, str] = {
    "RTLCostModel": "layerpipe._rtl_costs",
    "CocotbResult": "layerpipe.hdl._cocotb",
    "SIMULATORS": "layerpipe.hdl._cocotb",
    "available_simulators": "layerpipe.hdl._cocotb",
    "run_cocotb": "layerpipe.hdl._cocotb",
    "verilator_environment": "layerpipe.hdl._cocotb",
    "HardwareLimits": "layerpipe.hdl._program",
    "Program": "layerpipe.hdl._program",
    "SUPPORTED_POLICIES": "layerpipe.hdl._compiler",
    "compile_program": "layerpipe.hdl._compiler",
    "Opcode": "layerpipe.hdl._datapath",
    "Design": "layerpipe.hdl._flow",
    "make_design": "layerpipe.hdl._flow",
    "LINK_LATENCY": "layerpipe.hdl._link",
    "MAX_DEPTH": "layerpipe.hdl._pe",
    "MAX_DIM": "layerpipe.hdl._pe",
    "MAX_LANES": "layerpipe.hdl._pe",
    "PEConfig": "layerpipe.hdl._pe",
    "PEOp": "layerpipe.hdl._pe",
    "ProcessingElement": "layerpipe.hdl._pe",
    "VectorAddr": "layerpipe.hdl._pe",
    "command_layout": "layerpipe.hdl._pe",
    "op_cycles": "layerpipe.hdl._pe",
    "op_overhead": "layerpipe.hdl._pe",
    "pack_matrix": "layerpipe.hdl._pe",
    "pack_vector": "layerpipe.hdl._pe",
    "unpack_matrix": "layerpipe.hdl._pe",
    "unpack_vector": "layerpipe.hdl._pe",
    "LINT_WAIVERS": "layerpipe.hdl._synth",
    "LintResult": "layerpipe.hdl._synth",
    "SYNTH_TARGETS": "layerpipe.hdl._synth",
    "lint_verilog": "layerpipe.hdl._synth",
    "synthesize": "layerpipe.hdl._synth",
    "synthesize_design": "layerpipe.hdl._synth",
    "Accelerator": "layerpipe.hdl._top",
    "rtl_sim_config": "layerpipe.hdl._top",
    "component_verilog": "layerpipe.hdl._verilog",
}


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)


__all__ = [
    "LINK_LATENCY",
    "LINT_WAIVERS",
    "MAX_DEPTH",
    "MAX_DIM",
    "MAX_LANES",
    "SIMULATORS",
    "SUPPORTED_POLICIES",
    "SYNTH_TARGETS",
    "Accelerator",
    "CocotbResult",
    "Design",
    "HardwareLimits",
    "LintResult",
    "Opcode",
    "PEConfig",
    "PEOp",
    "ProcessingElement",
    "Program",
    "RTLCostModel",
    "VectorAddr",
    "available_simulators",
    "command_layout",
    "compile_program",
    "component_verilog",
    "lint_verilog",
    "make_design",
    "op_cycles",
    "op_overhead",
    "pack_matrix",
    "pack_vector",
    "rtl_sim_config",
    "run_cocotb",
    "synthesize",
    "synthesize_design",
    "unpack_matrix",
    "unpack_vector",
    "verilator_environment",
]
