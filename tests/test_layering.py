"""The layering of issue 13 item 3: nothing outside `layerpipe/commands/` (the CLI layer) imports
`layerpipe.commands`, and the file helpers (`layerpipe/_files.py`) sit below every layer.

Imports are read from the source with `ast` (module-level and function-local ones alike, since a local import
is still an upward dependency), so the test fails on the first new upward import wherever it hides.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Package folders and the import name each maps to (pyproject's package-dir: sim/ and hdl/ are subpackages).
PACKAGES = {"layerpipe": "layerpipe", "sim": "layerpipe.sim", "hdl": "layerpipe.hdl"}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for folder, name in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([name, *parts]), path))
    return out


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


MODULES = _modules()


def test_the_scan_sees_the_packages() -> None:
    names = {m for m, _ in MODULES}
    assert {"layerpipe.cli", "layerpipe.sim.trace", "layerpipe.hdl._flow", "layerpipe.dse._store",
            "layerpipe.report", "layerpipe._files", "layerpipe.commands._common"} <= names


@pytest.mark.parametrize(("module", "path"), [(m, p) for m, p in MODULES
                                              if not m.startswith("layerpipe.commands") and m != "layerpipe.cli"],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_no_upward_import_of_the_cli_layer(module: str, path: Path) -> None:
    upward = sorted(name for name in _imports(module, path)
                    if name == "layerpipe.commands" or name.startswith("layerpipe.commands."))
    upward += sorted(name for name in _imports(module, path) if name == "layerpipe.cli")
    assert not upward, f"{path.relative_to(ROOT)} imports the CLI layer: {upward}"


def test_file_helpers_import_nothing_of_layerpipe_but_errors() -> None:
    path = ROOT / "layerpipe" / "_files.py"
    ours = {name for name in _imports("layerpipe._files", path) if name.startswith("layerpipe")}
    assert ours <= {"layerpipe.errors", "layerpipe.errors.InputError"}, ours


def test_outputs_use_the_file_helpers() -> None:
    """The writers named by issue 13 take their atomic writes from `layerpipe._files`."""
    for rel in ("sim/trace.py", "hdl/_flow.py", "layerpipe/dse/_store.py", "layerpipe/report.py",
                "layerpipe/commands/simulate.py", "layerpipe/commands/rtl.py"):
        text = (ROOT / rel).read_text()
        assert "layerpipe._files" in text, rel
        assert "tempfile.mkdtemp" not in text and "os.replace(" not in text, f"{rel} swaps files by hand"


def test_the_order_of_layers_is_written_down() -> None:
    head = (ROOT / "docs" / "model.md").read_text()[:3000]
    assert "network → DFG → retiming → schedule IR → {simulator, RTL} → {DSE, report} → CLI" in head


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    """The scanner itself: a function-local and a relative upward import are both seen."""
    fake = tmp_path / "mod.py"
    fake.write_text("def f():\n    from ..commands._common import emit\n    import layerpipe.commands.rtl\n")
    found = _imports("layerpipe.sim.mod", fake)
    assert "layerpipe.commands._common" in found and "layerpipe.commands.rtl" in found
