"""unbatch-heads (and fold-gqa through a partial-rotary Concat, causal-mask through the crop
to the 4-D k): pnnx's dynamic exports of Phi-3 and GPT-NeoX, whose fused QKV leaves the
heads in ncnn's batch axis. Golden text of the rewrite on the real exports, and the fixed
graphs through ncnn at lengths no trace used against torch (fixtures/zoo)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import paramsurgery as ps
from paramsurgery.lint import lint_graph
from paramsurgery.formats.pnnx_param import read_pnnx_param
from paramsurgery.passes.fold_gqa import FoldGQA
from paramsurgery.passes.unbatch_heads import UnbatchHeads

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "fixtures" / "zoo"
sys.path.insert(0, str(REPO / "tools"))

from zoo import cells  # noqa: E402


def _lines(g, names):
    by = {layer.name: layer for layer in g}
    return [" ".join([by[n].type, n, *by[n].inputs, "->", *by[n].outputs,
                      *by[n].params.tokens()]) for n in names]


def test_neox_heads_out_of_the_batch_axis_golden() -> None:
    g = ps.load(ZOO / "gpt_neox" / "embeds_sdpa_dynamic.ncnn.param")
    assert "unbatch-heads" in {f.fix_pass for f in lint_graph(g) if f.code == "PS010"}
    res = UnbatchHeads()(g)
    assert [c.format() for c in res.changes][:3] == [
        "line 47: sdpa_43: q: 4 heads of 8 (partial rotary) in ncnn's batch axis: "
        "55 -> 55 [w=8, h=T, c=4]",
        "line 47: sdpa_43: k: 4 heads of 8 (partial rotary) in ncnn's batch axis: "
        "56 -> 56 [w=8, h=T, c=4]",
        "line 47: sdpa_43: v: 4 heads of 8 (batched) in ncnn's batch axis: "
        "36 -> 36_unbatch [w=8, h=T, c=4]"]
    assert _lines(res.graph, ["reshape_22", "cat_1_unbatch", "cat_1", "sdpa_43_v_unbatch"]) == [
        'Reshape reshape_22 47 -> 51 12=2 13=233 6="2,0n,4"',
        'Reshape cat_1_unbatch 48 -> 48_unbatch 12=2 13=233 6="6,0n,4"',
        "Concat cat_1 52 48_unbatch -> 55 0=2",
        'Reshape sdpa_43_v_unbatch 36 -> 36_unbatch 12=2 13=233 6="8,0n,4"']
    assert not [f for f in lint_graph(res.graph) if f.code == "PS010"]


def test_phi3_fold_gqa_walks_the_partial_rotary_concat_golden() -> None:
    base = ZOO / "phi3" / "embeds_sdpa_dynamic"
    g = ps.load(f"{base}.ncnn.param")
    res = FoldGQA(traced=read_pnnx_param(f"{base}.pnnx.param"))(g)
    assert [c.format() for c in res.changes] == [
        "line 59: sdpa_53: k/v expand expansion removed: 4 -> 2 kv heads (head_dim 8, rep 2)",
        "line 101: sdpa_54: k/v expand expansion removed: 4 -> 2 kv heads (head_dim 8, rep 2)"]
    out = res.graph
    assert _lines(out, ["reshape_25", "cat_2_unbatch", "cat_2", "sdpa_53_v_unbatch"]) == [
        'Reshape reshape_25 52 -> 57 12=2 13=233 6="4,0n,2"',
        'Reshape cat_2_unbatch 53 -> 53_unbatch 12=2 13=233 6="4,0n,2"',
        "Concat cat_2 58 53_unbatch -> 59 0=2",
        'Reshape sdpa_53_v_unbatch 37 -> 37_unbatch 12=2 13=233 6="8,0n,2"']
    assert not any(layer.type in ("Tensor.expand", "Tensor.reshape") for layer in out)
    # q is not fold-gqa's: unbatch-heads takes it (fix runs both)
    q = UnbatchHeads()(out)
    assert [c.layer for c in q.changes] == ["sdpa_53", "sdpa_54"]
    assert all(": q: 4 heads of 8 (partial rotary)" in c.format() for c in q.changes)


@pytest.mark.parametrize("family", ["gpt_neox", "phi3"])
def test_fixed_dynamic_export_is_torch_at_untraced_lengths(family: str, tmp_path: Path) -> None:
    """`fix` on the dynamic export (reference X.ref.npz at T=11 next to it), then ncnn at
    T = 5, 7, 10, 16 against torch: the rewrite is proven where no trace was taken."""
    outcome, fixed = cells.fix(family, "embeds_eager_dynamic", tmp_path)
    assert outcome.ok, outcome.short()
    assert {"5", "7", "10", "16"} <= set(outcome.errors)
    assert max(outcome.errors.values()) < 1e-5, outcome.errors
    text = fixed.read_text()
    assert "0=3" not in [t for line in text.splitlines() if line.startswith("Concat")
                         for t in line.split()[-1:]]
