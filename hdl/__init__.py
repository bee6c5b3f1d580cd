"""The Amaranth RTL of the layerpipe training accelerator, imported as `layerpipe.hdl`.

Processing element (`ProcessingElement`, configured by `PEConfig`, commanded by `PEOp`): local memories of
wide words (`lanes` fixed-point elements each), an op engine running one F/A/E/G/U command at a time on
`lanes` multipliers, with a closed cycle formula (`op_cycles`, the `rtl` cost model `RTLCostModel`).
See `hdl/_pe.py` for the memory layout, the command table and the timing contract.
"""

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

__all__ = [
    "MAX_DEPTH",
    "MAX_DIM",
    "MAX_LANES",
    "OP_OVERHEAD_CYCLES",
    "Opcode",
    "PEConfig",
    "PEOp",
    "ProcessingElement",
    "RTLCostModel",
    "VectorAddr",
    "command_layout",
    "op_cycles",
    "pack_matrix",
    "pack_vector",
    "unpack_matrix",
    "unpack_vector",
]
