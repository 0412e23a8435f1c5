"""The package's layering: no run-time import cycle anywhere (function-local imports count,
imports made only for type checking do not), and the layer contract of pyproject.toml
(`lint-imports`, also in the test command) holds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

grimp = pytest.importorskip("grimp")

ROOT = Path(__file__).resolve().parent.parent


def import_graph() -> nx.DiGraph:
    g = grimp.build_graph("paramsurgery", exclude_type_checking_imports=True)
    out = nx.DiGraph()
    for module in g.modules:
        out.add_node(module)
        for imported in g.find_modules_directly_imported_by(module):
            out.add_edge(module, imported)
    return out


def test_no_runtime_import_cycle():
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert cycles == []


def test_the_ir_imports_no_format_analysis_or_runtime():
    g = import_graph()
    bad = [(a, b) for a, b in g.edges
           if a.startswith("paramsurgery.ir.") and not b.startswith(("paramsurgery.ir.", "paramsurgery.core."))]
    assert bad == []


def test_the_layer_contract_holds():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed")
    proc = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_a_broken_contract_is_caught(tmp_path):
    """The contract is not vacuous: an upward import in the IR is reported."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed")
    pkg = tmp_path / "paramsurgery"
    shutil.copytree(ROOT / "paramsurgery", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "ir" / "upward.py").write_text("from paramsurgery.formats import io  # noqa\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    proc = subprocess.run([exe, "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "paramsurgery.ir.upward -> paramsurgery.formats.io" in proc.stdout
