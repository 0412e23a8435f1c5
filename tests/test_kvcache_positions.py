"""add-kvcache on token positions counted from a run-time length (the causal mask
`causal-mask` builds from an SDPA's q/k lengths): rewritten to count from the past, parity
through ncnn (prefill + single-token steps at lengths no trace used, against a full
prefill); left alone, or reading the past from the k cache, the first cached step goes
wrong. Golden text: tests/cases/kvcache/causal_positions.case."""

from __future__ import annotations

from pathlib import Path

import pytest

import paramsurgery
from paramsurgery.core.errors import PassRefused
from paramsurgery.passes.kvcache import AddKVCache
from paramsurgery.passes.kvcache_positions import key_chains, position_chains
from paramsurgery.verify.kvcache import verify_kvcache

CASE = Path(__file__).parent / "cases" / "kvcache" / "causal_positions.case"
SHAPES = {"in0": ("T", 8)}


def _graph() -> paramsurgery.Graph:
    text = CASE.read_text()
    return paramsurgery.loads(text.split("--- input\n", 1)[1].split("--- expect", 1)[0])


def _verify(tmp_path: Path, g, n: int, m: int):
    param, bin_ = tmp_path / "kv.param", tmp_path / "kv.bin"
    paramsurgery.save(g, param, bin=bin_)
    return verify_kvcache(param, bin_, n=n, m=m, inputshape=SHAPES)


def test_the_mask_chains_are_recognised():
    g = _graph()
    chains = position_chains(g)
    assert sorted(c.src for c in chains) == ["k", "q"]
    assert list(key_chains(g, chains).values()) == ["sdpa_0"]  # the columns: sdpa_0's keys


@pytest.mark.parametrize("n, m", [(5, 3), (9, 6)])
def test_counted_positions_keep_parity(tmp_path, n, m):
    res = AddKVCache()(_graph())
    assert res.modified and not position_chains(res.graph)  # rewritten (idempotent shape)
    report = _verify(tmp_path, res.graph, n, m)
    assert report.error is None and report.ok, report.format()
    assert max(s.max_rel for s in report.steps) < 1e-5


def test_positions_left_at_the_call_length_break_the_cache(tmp_path, monkeypatch):
    """What the rewrite repairs: the same cache with the counts left alone (the mask the new
    rows only cover, the old refusal bypassed) is wrong from the first cached step."""
    import paramsurgery.passes.kvcache as kv

    monkeypatch.setattr(kv, "position_chains", lambda g: [])
    monkeypatch.setattr(kv, "mask_crop", lambda *a, **k: None)
    report = _verify(tmp_path, AddKVCache()(_graph()).graph, 5, 3)
    assert report.steps[0].max_rel < 1e-5 and not report.ok


def test_the_past_read_from_the_k_cache_breaks_it(tmp_path):
    """Why the past is the v cache's h: with 4 kv heads a Split of the k cache packs it and
    ncnn's x86 SDPA, whose k cache layout its Mat header does not describe, reads garbage."""
    g = AddKVCache()(_graph()).graph
    for layer in g.layers:
        if layer.type in ("Interp", "Crop") and any(b.startswith("cache_v_in_0") for b in
                                                    layer.inputs):
            g.set_inputs(layer, [layer.inputs[0], "cache_k_in_0"])
    g.remove_trivial_splits()
    g.insert_splits()
    report = _verify(tmp_path, g, 5, 3)
    assert report.steps[0].max_rel < 1e-5 and not report.ok


def test_a_count_of_something_else_is_refused():
    """A count whose h is not an SDPA's q/k or a RotaryEmbed's input: refused naming its
    Crop (under a cache it might not be the tokens of the call)."""
    g = _graph()
    crop = g.layer("pnnx_fold_attention_mask_q1")
    g.set_inputs(crop, ["x0_extra"])
    g.add_layer("BinaryOp", "extra", ["in0"], ["x0_extra"], {0: 2, 1: 1, 2: 1.0})
    g.insert_splits()
    with pytest.raises(PassRefused, match="pnnx_fold_attention_mask_q1: counts positions"):
        AddKVCache()(g)


def test_caching_some_layers_only_is_refused():
    """The counts feed every layer that reads the mask: with one SDPA left uncached they
    cannot count from the past for some layers only."""
    g = _graph()
    g.add_layer("SDPA", "sdpa_1", ["q", "k", "v", "mask"], ["a2"], {5: 1})
    g.insert_splits()
    with pytest.raises(PassRefused, match="sdpa_1: left without a cache"):
        AddKVCache(skip=["sdpa_1"])(g)
