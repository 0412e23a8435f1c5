"""add-kvcache on HF's mask crop to the key length (`Crop mask k 20="1h"`): widened to past +
current, parity through ncnn (prefill + single-token steps at lengths no trace used against
a full prefill); without the widening the first cached step goes wrong. Golden text:
tests/cases/kvcache/mask_crop*.case, mask_from_query.case."""

from __future__ import annotations

from pathlib import Path

import pytest

import paramsurgery
from paramsurgery.passes.kvcache import AddKVCache, cache_slots
from paramsurgery.verify.kvcache import verify_kvcache

CASE = Path(__file__).parent / "cases" / "kvcache" / "mask_crop.case"


def _graph_text() -> str:
    text = CASE.read_text()
    return text.split("--- input\n", 1)[1].split("--- expect", 1)[0]


def _write(tmp_path: Path, g, name: str) -> tuple[Path, Path]:
    param, bin_ = tmp_path / f"{name}.param", tmp_path / f"{name}.bin"
    paramsurgery.save(g, param, bin=bin_)
    return param, bin_


SHAPES = {"in0": ("T", 8), "in1": (1, "T", "T")}


@pytest.mark.parametrize("n, m", [(5, 3), (9, 6)])
def test_widened_crop_keeps_parity(tmp_path, n, m):
    res = AddKVCache()(paramsurgery.loads(_graph_text()))
    assert res.graph.layer("slice1_0").params.get(20) == "+(1h,2h)"
    param, bin_ = _write(tmp_path, res.graph, "kv")
    report = verify_kvcache(param, bin_, n=n, m=m, inputshape=SHAPES)
    assert report.error is None and report.ok, report.format()
    assert max(s.max_rel for s in report.steps) < 1e-5


def test_the_crop_left_at_the_key_length_breaks_the_cache(tmp_path):
    """What the rewrite repairs: the same cache with the Crop left at k's own length (the new
    rows only) is wrong from the first cached step."""
    res = AddKVCache()(paramsurgery.loads(_graph_text()))
    g = res.graph
    crop = g.layer("slice1_0")
    g.set_inputs(crop, list(crop.inputs[:2]))
    crop.set(20, "1h")
    g.remove_trivial_splits()
    param, bin_ = _write(tmp_path, g, "narrow")
    report = verify_kvcache(param, bin_, n=5, m=3, inputshape=SHAPES)
    assert report.steps[0].max_rel < 1e-5 and not report.ok


def test_cache_slots_are_the_inputs_above_splits():
    """The v cache is read by the Crop and the SDPA (a Split): its slot is the Input's blob,
    which is what a decode loop feeds."""
    g = AddKVCache()(paramsurgery.loads(_graph_text())).graph
    (slot,) = cache_slots(g)
    assert (slot.k_in, slot.v_in) == ("cache_k_in_0", "cache_v_in_0")
    assert g.producer(slot.k_in).type == "Input" and g.producer(slot.v_in).type == "Input"
