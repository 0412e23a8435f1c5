"""pnnx's dynamic export (`inputshape2`) of HF decoders (issue 24, docs/dynamic-export-decoders.md):
the causal mask built in the graph from the input's length (`causal-mask`), HF's repeat_kv with
the batch axis kept on k (`fold-gqa`), and the arange positions add-kvcache counts from the
past. Numbers through ncnn at lengths no trace used (the fixtures carry no traced length: the
graphs are dynamic); golden text: tests/cases/{causal_mask,fold_gqa,kvcache}/; the zoo's
dynamic exports end to end: tests/test_zoo.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.passes.causal_mask import CausalMaskPass, prove_built
from paramsurgery.passes.fold_gqa import FoldGQA
from paramsurgery.formats.pnnx_param import read_pnnx_param
from paramsurgery.core.match import MatchFailure
from paramsurgery.runtime.child import RunOptions, run_isolated

MASKS = Path(__file__).resolve().parents[1] / "fixtures" / "masks"
NEG = float(np.finfo(np.float32).min)


def _sdpa(q, k, v, scale, m=None):
    s = q.astype(np.float64) @ k.transpose(0, 2, 1) * scale
    if m is not None:
        s = s + m
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def _run(g: paramsurgery.Graph, tmp_path: Path, feeds: dict) -> np.ndarray:
    param = tmp_path / "g.param"
    paramsurgery.save(g, param)
    res = run_isolated(str(param), None, feeds, ["out0"], RunOptions())
    assert res.ok, res.describe()
    return res.outputs["out0"]


# --------------------------------------------------------------------------- causal mask

def _built() -> paramsurgery.Graph:
    return paramsurgery.load(MASKS / "built_causal.param")


@pytest.mark.parametrize("t", [5, 9])
def test_built_mask_rebuilt_right_at_every_length(tmp_path, t):
    """torch: triu(full((T, T), finfo.min), 1) cropped to each SDPA's keys, two SDPAs (the
    second reads the first's output as its keys); ncnn runs the rebuilt graph."""
    res = CausalMaskPass(MASKS / "built_causal.pnnx.param")(_built())
    assert res.modified and not [x for x in res.graph if x.type in ("aten::triu", "torch.full")]
    rng = np.random.default_rng(t)
    q, k, v = (rng.standard_normal((2, t, 4)).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((t, 8)).astype(np.float32)  # gives the length only
    m = np.triu(np.full((t, t), NEG, dtype=np.float64), 1)
    a = _sdpa(q, k, v, 0.5, m).astype(np.float32)  # sdpa_0: no 6=, 1/sqrt(D = 4)
    want = _sdpa(q, a, v, 0.5, m)
    out = _run(res.graph, tmp_path, {"in0": q, "in1": k, "in2": v, "in3": x})
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-5


def test_built_mask_read_by_another_layer_is_left():
    g = paramsurgery.loads((MASKS / "built_causal.param").read_text().replace(
        "SDPA                     sdpa_1                   4 1 q1 a1 v1 c1 out0 5=1 6=0.5",
        "BinaryOp                 add_1                    2 1 a1 c1 out0 0=0"))
    with pytest.raises(MatchFailure) as exc:
        prove_built(g, g.layer("pnnx_0"), read_pnnx_param(MASKS / "built_causal.pnnx.param"))
    assert exc.value.layer == "add_1" and "BinaryOp" in exc.value.reason


def test_built_mask_fill_value_must_mask(tmp_path):
    """A torch.full filling 0 (an all-zero triu: no mask) is not a causal mask."""
    pnnx = tmp_path / "z.pnnx.param"
    pnnx.write_text((MASKS / "built_causal.pnnx.param").read_text().replace(
        "fill_value=-3.40282347e38", "fill_value=0.0"))
    res = CausalMaskPass(pnnx)(_built())
    assert not res.modified
    assert any(s.layer == "torch.full_0" and "not a masking value" in s.reason
               for s in res.skipped)


# --------------------------------------------------------------------------- repeat_kv

@pytest.mark.parametrize("t", [5, 9])
def test_fold_gqa_batch_axis_k_right_at_every_length(tmp_path, t):
    """torch: k, v = proj.view(T, 2, 8).transpose(0, 1), repeat_interleave(2) to 4 heads;
    ncnn runs the folded graph (SDPA's own GQA on 2 kv heads)."""
    g = paramsurgery.load(MASKS / "gqa_batch_k.param")
    res = FoldGQA(traced=read_pnnx_param(MASKS / "gqa_batch_k.pnnx.param"))(g)
    assert res.modified and res.data["folded"][0]["kv_heads"] == 2
    rng = np.random.default_rng(t)
    q = rng.standard_normal((4, t, 8)).astype(np.float32)
    kp, vp = (rng.standard_normal((t, 16)).astype(np.float32) for _ in range(2))
    k, v = (p.reshape(t, 2, 8).transpose(1, 0, 2) for p in (kp, vp))
    want = _sdpa(q, np.repeat(k, 2, 0), np.repeat(v, 2, 0), 0.353553385)
    out = _run(res.graph, tmp_path, {"in0": q, "in1": kp, "in2": vp})
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-5


def test_fold_gqa_batch_axis_k_wrong_order_is_left(tmp_path):
    """An expand that grows the heads axis instead of the new one (the j mod G order, or no
    repeat_kv at all) is not folded: pnnx's traced shapes say which axis grew."""
    pnnx = tmp_path / "g.pnnx.param"
    pnnx.write_text((MASKS / "gqa_batch_k.pnnx.param").read_text().replace(
        "#3=(1,2,2,?,8)f32 #4", "#3=(1,4,1,?,8)f32 #4").replace(
        "#1=(1,2,1,?,8)f32 #3=(1,2,2,?,8)f32", "#1=(1,2,1,?,8)f32 #3=(1,4,1,?,8)f32"))
    res = FoldGQA(traced=read_pnnx_param(pnnx))(paramsurgery.load(MASKS / "gqa_batch_k.param"))
    assert not res.modified
    assert any("Tensor.expand 'Tensor.expand_k'" in s.reason for s in res.skipped)


def test_phi3_dynamic_partial_rotary_with_its_parts_swapped_is_left_naming_the_concat():
    """Phi-3's dynamic export joins a RotaryEmbed of part of each head with the rest on
    blobs that keep pnnx's batch axis; fold-gqa walks that Concat (tests/test_unbatch_heads.py)
    only when it puts one Slice's parts back in their order: swapped, it leaves the SDPA,
    naming the Concat."""
    zoo = MASKS.parent / "zoo" / "phi3"
    g = paramsurgery.load(zoo / "embeds_sdpa_dynamic.ncnn.param")
    cat = g.layer("cat_2")
    g.set_inputs(cat, list(reversed(cat.inputs)))
    res = FoldGQA(traced=read_pnnx_param(zoo / "embeds_sdpa_dynamic.pnnx.param"))(g)
    why = {s.layer: s.reason for s in res.skipped}
    assert "Concat 'cat_2'" in why["sdpa_53"] and "other order" in why["sdpa_53"], why
    assert "sdpa_54" not in why  # the other layer's SDPA is folded


def test_fix_proves_a_rebuilt_mask_against_the_reference_by_default(tmp_path, capsys):
    """A mask rebuilt from the run-time lengths changes what the graph computes at every
    length: fix runs the result through ncnn against X.ref.npz next to the input without
    --verify (GPT-2's dynamic export exited 0 at rel 0.25 while lower's arange fed its
    position Embed float32 ids)."""
    import shutil

    from paramsurgery.cli import main

    src = MASKS.parent / "zoo" / "gpt2"
    for suffix in (".ncnn.param", ".ncnn.bin", ".pnnx.param", ".ref.npz", ".ref.io.json",
                   "_ncnn.py"):
        shutil.copy(src / f"embeds_sdpa_dynamic{suffix}", tmp_path)
    param = tmp_path / "embeds_sdpa_dynamic.ncnn.param"
    rc = main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o",
               str(tmp_path / "f.param")])
    out = capsys.readouterr().out
    assert rc == 0 and "verify against" in out and ": ok:" in out, out[-2000:]
