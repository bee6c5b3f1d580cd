"""Design-space exploration: sweeps, a crash-safe results file, local or Dask execution, Pareto fronts."""

from layerpipe.dse._pareto import OBJECTIVES, pareto_front, save_pareto
from layerpipe.dse._runner import RunSummary, run_sweep
from layerpipe.dse._store import COLUMNS, ResultsFile
from layerpipe.dse._sweep import SWEEP_KEYS, DesignPoint, SweepSpec, load_sweep_yaml

__all__ = [
    "COLUMNS",
    "OBJECTIVES",
    "SWEEP_KEYS",
    "DesignPoint",
    "ResultsFile",
    "RunSummary",
    "SweepSpec",
    "load_sweep_yaml",
    "pareto_front",
    "run_sweep",
    "save_pareto",
]
