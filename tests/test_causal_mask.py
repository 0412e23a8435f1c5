"""causal-mask: pnnx's folded causal mask proven from its values and rebuilt from the
run-time lengths, alone and inside dynamize (one trace, --pair); numbers through ncnn at
lengths no trace used (the fixtures are traced at 6 and 8). Golden text: tests/cases/causal_mask/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.analysis.shapes.affine import Affine
from paramsurgery.core.errors import PassRefused
from paramsurgery.passes.causal_mask import CausalMaskPass, causal_value, prove_causal
from paramsurgery.passes.dynamize import Dynamize
from paramsurgery.passes.dynamize_shapes import LengthSpec, ShapeDynamize
from paramsurgery.runtime.child import RunOptions, run_isolated
from paramsurgery.formats.pnnx_traced import load_traced

MASKS = Path(__file__).resolve().parents[1] / "fixtures" / "masks"
NEG = float(np.finfo(np.float32).min)


def load(name: str) -> paramsurgery.Graph:
    return paramsurgery.load(MASKS / f"{name}.param", bin=MASKS / f"{name}.bin")


def _sdpa(q, k, v, m, scale):
    s = q.astype(np.float64) @ k.transpose(0, 2, 1) * scale + m
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def _torch_like(t: int, seed: int):
    """The fixture's graph at length t in numpy: two SDPAs under the causal mask."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, t, 4)).astype(np.float32) for _ in range(3))
    m = np.triu(np.full((t, t), NEG, dtype=np.float64), 1)
    a = _sdpa(q, k, v, m, 0.5)
    return {"in0": q, "in1": k, "in2": v}, _sdpa(q, a.astype(np.float32), v, m, 0.5)


def _run_at(g, tmp_path, t: int, seed: int = 0) -> float:
    param, bin_ = tmp_path / f"g{t}.param", tmp_path / f"g{t}.bin"
    paramsurgery.save(g, param, bin=bin_)
    feeds, want = _torch_like(t, seed)
    res = run_isolated(str(param), str(bin_), feeds, ["out0"], RunOptions())
    assert res.ok, res.describe()
    return float(np.abs(res.outputs["out0"] - want).max() / np.abs(want).max())


@pytest.mark.parametrize("value", [NEG, -np.inf, -1e4, -1e9])
def test_causal_values_are_proven(value):
    m = np.triu(np.full((5, 5), value, dtype=np.float32), 1)
    assert causal_value(m[None])[0] == pytest.approx(float(np.float32(value)))


@pytest.mark.parametrize("arr, why", [
    (np.zeros((4, 4), np.float32), "not a masking value"),
    (np.triu(np.full((4, 4), NEG, np.float32), 2), "not all one value"),
    (np.tril(np.full((4, 4), NEG, np.float32), -1), "on or below the diagonal"),
    (np.zeros((3, 4), np.float32), "not one square"),
    (np.zeros((2, 3, 3), np.float32), "not one square"),
    (np.zeros((1, 1), np.float32), "1×1"),
])
def test_other_constants_are_not(arr, why):
    v, reason = causal_value(arr)
    assert v is None and why in reason


@pytest.mark.parametrize("t", [3, 6, 9, 17])
def test_rebuilt_mask_is_causal_at_every_length(tmp_path, t):
    result = CausalMaskPass()(load("causal_sdpa6"))
    assert result.modified and not result.graph.by_type("MemoryData")
    assert _run_at(result.graph, tmp_path, t) < 1e-5


def test_the_traced_graph_is_right_only_at_its_length(tmp_path):
    """What the pass repairs: the folded mask is wrong at any other length (ncnn reads a 6-wide
    mask for 9 keys)."""
    g = load("causal_sdpa6")
    assert _run_at(g, tmp_path, 6) < 1e-5
    param, bin_ = tmp_path / "raw.param", tmp_path / "raw.bin"
    paramsurgery.save(g, param, bin=bin_)
    feeds, want = _torch_like(9, 0)
    res = run_isolated(str(param), str(bin_), feeds, ["out0"], RunOptions())
    assert not res.ok or np.nan_to_num(np.abs(res.outputs["out0"] - want), nan=np.inf).max() > 1e-2


def test_dynamize_one_trace_rebuilds_the_mask(tmp_path):
    """The shape walk of dynamize (what `fix` runs with a reference at another length) meets a
    MemoryData holding the traced length: proven causal, its SDPA's q/k lengths follow T."""
    T = Affine.symbol("T")
    spec = LengthSpec({b: (2, T, 4) for b in ("in0", "in1", "in2")}, {}, 6)
    g = load("causal_sdpa6")
    result = ShapeDynamize(spec).run(g)
    assert any("causal mask (6×6" in c.what for c in result.changes)
    assert _run_at(result.graph, tmp_path, 11, seed=3) < 1e-5


def test_dynamize_refuses_a_traced_constant_it_cannot_prove(tmp_path):
    """Never left at the traced size: a (T, T) constant that is not causal is refused, named."""
    T = Affine.symbol("T")
    spec = LengthSpec({b: (2, T, 4) for b in ("in0", "in1", "in2")}, {}, 6)
    with pytest.raises(PassRefused) as exc:
        ShapeDynamize(spec).run(load("padding_sdpa6"))
    assert "pnnx_fold_attention_mask" in exc.value.message
    assert "not causal" in exc.value.message or "on or below the diagonal" in exc.value.message


def test_dynamize_refuses_a_mask_whose_lengths_do_not_follow(tmp_path):
    """The key length is fixed (8) while the mask side is the traced 6: refused."""
    T = Affine.symbol("T")
    spec = LengthSpec({"in0": (2, T, 4), "in1": (2, 6, 4), "in2": (2, 6, 4)}, {}, 6)
    with pytest.raises(PassRefused, match="key length"):
        ShapeDynamize(spec).run(load("causal_sdpa6"))


def test_dynamize_pair_rebuilds_the_mask(tmp_path):
    """--pair: the mask differs in both dims between the exports (6×6, 8×8); proven causal in
    both, it is rebuilt instead of refused as 'more than one of its dims'."""
    result = Dynamize(pair=load("causal_sdpa8"), pair_len=8, traced_len=6)(load("causal_sdpa6"))
    assert any("causal mask" in c.what for c in result.changes)
    assert _run_at(result.graph, tmp_path, 13, seed=5) < 1e-5


def test_prove_causal_names_the_reader():
    g = paramsurgery.loads("7767517\n3 3\nInput in0 0 1 in0\n"
                           "MemoryData pnnx_fold_attention_mask 0 1 m 0=3 1=3\n"
                           "BinaryOp add_0 2 1 in0 m out0 0=0\n")
    with pytest.raises(PassRefused, match="read by BinaryOp 'add_0'"):
        prove_causal(g, g.layer("pnnx_fold_attention_mask"))


@pytest.mark.parametrize("t", [3, 9, 20])
def test_rope_tables_computed_at_run_time(tmp_path, t):
    """dynamize with a reference past the traced rows (T=6, reference at 9): cos/sin(p·θ)
    from the run-time length, right at lengths no trace used (torch-style float32 RoPE in
    numpy as the reference; golden text: tests/cases/dynamize/rope_table_computed.case)."""
    import importlib.util

    from paramsurgery.passes.dynamize_shapes import reference_shapes

    spec_ = importlib.util.spec_from_file_location(
        "fixtures_masks", Path(__file__).resolve().parents[1] / "tools" / "fixtures_masks.py")
    assert spec_ is not None and spec_.loader is not None
    tool = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(tool)
    ref = reference_shapes(str(MASKS / "rope6.ref.npz"))
    assert ref is not None
    d = Dynamize(traced=load_traced(MASKS / "rope6.pnnx.param"), reference=(*ref, str(MASKS / "rope6.ref.npz")))
    g = d(load("rope6")).graph
    assert not [m for m in g.by_type("MemoryData") if m.params.get(1) == 6]
    param, bin_ = tmp_path / "r.param", tmp_path / "r.bin"
    paramsurgery.save(g, param, bin=bin_)
    x = np.random.default_rng(t).standard_normal((2, t, 4)).astype(np.float32)
    res = run_isolated(str(param), str(bin_), {"in0": x}, ["out0"], RunOptions())
    assert res.ok, res.describe()
    want = tool.rope(x)
    assert float(np.abs(res.outputs["out0"] - want).max()) < 1e-5
