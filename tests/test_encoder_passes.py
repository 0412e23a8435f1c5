"""Issue 24's encoder-side repairs on small graphs in pnnx's own forms: fix-tied-linear
(lint PS017) and fix-pow (lint PS018): numbers through ncnn at lengths no trace used against
numpy, and lint naming each repair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.formats.param_text import dumps
from paramsurgery.lint import lint_graph
from paramsurgery.passes.fix_pow import FixPow
from paramsurgery.passes.fix_tied_linear import FixTiedLinear
from paramsurgery.runtime.child import Feed, Fetch, run

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "encoder"


def _layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    return (x64 - mu) / np.sqrt(var + 1e-5) * gamma + beta


@pytest.mark.parametrize("t", [5, 13])
def test_tied_linear_computes_the_logits_at_any_length(tmp_path, t) -> None:
    g = paramsurgery.load(FIX / "tied_head.param", bin=FIX / "tied_head.bin")
    assert [f.code for f in lint_graph(g, run=False) if f.code == "PS017"] == ["PS017"]
    table = g.layer("model.transformer.wte").weights[0].array().reshape(12, 8)
    ln = g.layer("ln_6").weights
    x = np.random.default_rng(t).standard_normal((t, 8)).astype(np.float32)
    want = _layernorm(x, ln.get("gamma").array(), ln.get("beta").array()) @ table.T
    raw = run(dumps(g), FIX / "tied_head.bin", {"in0": Feed(x, 233)}, [Fetch("out0", 233)])
    assert raw["out0"].shape != want.shape  # pnnx's form: (12, 12) = W·Wᵀ + h, whatever t is
    res = FixTiedLinear()(g)
    assert res.modified and "PS017" not in {f.code for f in lint_graph(res.graph, run=False)}
    paramsurgery.save(res.graph, tmp_path / "y.param", bin=tmp_path / "y.bin")
    got = run((tmp_path / "y.param").read_text(), tmp_path / "y.bin", {"in0": Feed(x, 233)},
              [Fetch("out0", 233)])["out0"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_fix_runs_the_tied_linear_repair(tmp_path, capsys) -> None:
    out = tmp_path / "y.param"
    code = main(["fix", str(FIX / "tied_head.param"), "--bin", str(FIX / "tied_head.bin"),
                 "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "fix-tied-linear: 1 change(s)" in text
    assert "InnerProduct             linear_7                 1 1 2 out0" in out.read_text()


POW = """7767517
3 3
Input in0 0 1 in0
BinaryOp pow_0 1 1 in0 1 0=6 1=1 2={n}
ReLU relu_0 1 1 1 out0 0=-1.0
"""


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_fix_pow_is_right_for_negative_bases(n) -> None:
    text = POW.format(n=f"{n}.0")
    g = paramsurgery.loads(text, "m.param")
    assert any(f.code == "PS018" for f in lint_graph(g, run=False))
    x = np.linspace(-1.7, 1.3, 11 * 3, dtype=np.float32).reshape(11, 3)  # 11 rows: any length
    want = x.astype(np.float64) ** n
    want = np.where(want > 0, want, -want)  # the leaky ReLU with slope -1: |x**n|
    raw = run(text, None, {"in0": Feed(x, 233)}, [Fetch("out0", 233)])["out0"]
    assert np.abs(raw - want).max() > 1.0  # ncnn's pow of a negative base: 2.4e38
    res = FixPow()(g)
    assert res.modified and not any(f.code == "PS018" for f in lint_graph(res.graph, run=False))
    got = run(dumps(res.graph), None, {"in0": Feed(x, 233)}, [Fetch("out0", 233)])["out0"]
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    assert not FixPow()(res.graph).modified  # idempotent


def test_fix_pow_leaves_non_negative_bases_and_other_exponents() -> None:
    text = """7767517
4 5
Input in0 0 1 in0
Sigmoid sig 1 1 in0 1
BinaryOp pow_0 1 1 1 2 0=6 1=1 2=3.0
BinaryOp pow_1 1 1 2 out0 0=6 1=1 2=0.5
"""
    g = paramsurgery.loads(text, "m.param")
    assert not any(f.code == "PS018" for f in lint_graph(g, run=False))
    res = FixPow()(g)
    assert not res.modified and "its base is never negative" in res.format(explain=True)
