"""The Amaranth RTL of the layerpipe training accelerator, imported as `layerpipe.hdl`.

Processing element (`ProcessingElement`, configured by `PEConfig`, commanded by `PEOp`): local memories of
wide words (`lanes` fixed-point elements each), an op engine running one F/A/E/G/U command at a time on
`lanes` multipliers, with a closed cycle formula (`op_cycles`, the `rtl` cost model `RTLCostModel`).
See `hdl/_pe.py` for the memory layout, the command table and the timing contract.

Tooling: `export_verilog` (deterministic), `lint_verilog` (Verilator, documented waivers), `synthesize`
(yosys generic / iCE40 figures), `run_cocotb` (cocotb benches on Icarus or Verilator, toolchain facts in
one place).
"""

from layerpipe.hdl._cocotb import SIMULATORS, CocotbResult, available_simulators, run_cocotb, verilator_environment
from layerpipe.hdl._costs import RTLCostModel
from layerpipe.hdl._datapath import Opcode
from layerpipe.hdl._pe import (
    MAX_DEPTH,
    MAX_DIM,
    MAX_LANES,
    OP_OVERHEAD_CYCLES,
    PEConfig,
    PEOp,
    ProcessingElement,
    VectorAddr,
    command_layout,
    op_cycles,
    pack_matrix,
    pack_vector,
    unpack_matrix,
    unpack_vector,
)
from layerpipe.hdl._synth import (
    LINT_WAIVERS,
    SYNTH_TARGETS,
    LintResult,
    export_verilog,
    lint_verilog,
    synthesize,
    synthesize_design,
)

__all__ = [
    "LINT_WAIVERS",
    "MAX_DEPTH",
    "MAX_DIM",
    "MAX_LANES",
    "OP_OVERHEAD_CYCLES",
    "SIMULATORS",
    "SYNTH_TARGETS",
    "CocotbResult",
    "LintResult",
    "Opcode",
    "PEConfig",
    "PEOp",
    "ProcessingElement",
    "RTLCostModel",
    "VectorAddr",
    "available_simulators",
    "command_layout",
    "export_verilog",
    "lint_verilog",
    "op_cycles",
    "pack_matrix",
    "pack_vector",
    "run_cocotb",
    "synthesize",
    "synthesize_design",
    "unpack_matrix",
    "unpack_vector",
    "verilator_environment",
]
