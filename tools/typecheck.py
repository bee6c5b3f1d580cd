"""Run mypy over layerpipe, sim and hdl as the one package they are installed as.

sim/ and hdl/ are the subpackages layerpipe.sim and layerpipe.hdl only through setuptools' package-dir
mapping (pyproject.toml), which mypy cannot read: run on the folders as they lie, every
`from layerpipe.sim import ...` is a missing module and every type from there is unchecked. So this
builds the installed layout out of symlinks (build/typecheck/layerpipe/, with sim and hdl inside),
runs mypy on it with the settings of pyproject's [tool.mypy], and prints the errors with the
checkout's own paths (sim/_engine.py, not build/typecheck/layerpipe/sim/_engine.py).

    .venv/bin/python tools/typecheck.py [extra mypy arguments]

Exit status: mypy's (0 when there are no errors).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
#: Installed subpackage name → folder in the checkout (pyproject.toml's [tool.setuptools.package-dir]).
MAPPED = {"sim": "sim", "hdl": "hdl"}


def build_tree() -> Path:
    """build/typecheck/layerpipe: a symlink per entry of layerpipe/, plus sim and hdl.

    Only the package folder is rebuilt: mypy's cache (build/typecheck/.mypy_cache, mypy runs with
    cwd=TREE) is kept, so a second run re-checks only the modules that changed.
    """
    package = TREE / "layerpipe"
    if package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    for entry in sorted((ROOT / "layerpipe").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in MAPPED.items():
        (package / name).symlink_to(ROOT / folder)
    return package


def main(argv: list[str]) -> int:
    package = build_tree()
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(package), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=TREE)
    prefix = "layerpipe/"
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith(prefix):
            rest = line[len(prefix):]
            head = rest.split("/", 1)[0]
            line = rest if head in MAPPED else line
        print(line)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
