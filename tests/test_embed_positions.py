"""GPT-2's learned position table in pnnx's dynamic export (issue 24): `wpe(arange(T))`
stays an Embed over `torch.arange`, which `lower` turns into a table cropped to the length.
ncnn's Embed reads its bottom as int32, so the table holds int32 bit patterns (float 1.0
read as an int is 1065353216: every position past 0 got the last row, rel error 0.2-0.3).
(`lower_values._read_as_ids`; the same repair landed twice, this test keeps both honest.)
Then `fix` runs right at T = 5, 16 (no trace used them) and verifies against the reference
next to the file by default; a reference the repaired graph does not match is refused."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.formats.weights import set_weights

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "fixtures" / "zoo" / "gpt2"
ROUTE = "embeds_sdpa_dynamic"
sys.path.insert(0, str(REPO / "tools"))


def _fix(tmp: Path, src: Path = ZOO) -> tuple[int, Path]:
    out = tmp / "f.param"
    code = main(["fix", str(src / f"{ROUTE}.ncnn.param"), "--bin",
                 str(src / f"{ROUTE}.ncnn.bin"), "-o", str(out)])
    return code, out


def test_positions_an_embed_reads_are_int32_and_right_at_untraced_lengths(tmp_path, capsys):
    from zoo import cells

    code, out = _fix(tmp_path)
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"verify against {ZOO / ROUTE}.ref.npz: ok" in text  # by default: no --verify
    g = paramsurgery.load(out, bin=out.with_suffix(".bin"))
    table = g.layer("torch.arange_41_table")  # lower's arange table, read by the wpe Embed
    values = table.weights[0].array().reshape(-1)
    assert np.array_equal(values.view(np.int32), np.arange(values.size))
    errors, first = cells.run_at_lengths(out, out.with_suffix(".bin"), "gpt2", ROUTE, [5, 16])
    assert max(errors.values()) <= 1e-5, first
    # the same graph with float positions: the Embed reads their bits (the failure fixed)
    set_weights(table, {"data": np.arange(values.size, dtype=np.float32)})
    paramsurgery.save(g, tmp_path / "float.param", bin=tmp_path / "float.bin")
    errors, _ = cells.run_at_lengths(tmp_path / "float.param", tmp_path / "float.bin", "gpt2",
                                     ROUTE, [5])
    assert errors[5] > 0.05


def test_fix_refuses_what_the_reference_next_to_the_file_does_not_confirm(tmp_path, capsys):
    """A reference next to the input and the weights: fix runs the repaired graph through
    ncnn against it before writing, --verify or not (here the reference's output is
    scaled, so no correct repair matches it): exit 1, nothing written."""
    for name in (f"{ROUTE}.ncnn.param", f"{ROUTE}.ncnn.bin", f"{ROUTE}.pnnx.param",
                 f"{ROUTE}_ncnn.py", f"{ROUTE}.ref.io.json"):
        shutil.copy(ZOO / name, tmp_path / name)
    with np.load(ZOO / f"{ROUTE}.ref.npz") as z:
        arrays = {k: z[k] for k in z.files}
    key = next(k for k in arrays if k.startswith("output"))
    arrays[key] = arrays[key] * 2
    np.savez(tmp_path / f"{ROUTE}.ref.npz", **arrays)
    work = tmp_path / "out"
    work.mkdir()
    code, out = _fix(work, tmp_path)
    err = capsys.readouterr().err
    assert code == 1 and not out.exists()
    assert "MISMATCH" in err and "the repaired graph does not match the reference" in err


@pytest.mark.parametrize("family", ["gpt2"])
def test_cached_decode_counts_the_embed_positions_from_the_past(tmp_path, family):
    """add-kvcache on the fixed export: the int32 positions are counted from the past (the
    v cache's h), so the greedy decode through ncnn gives HF's tokens and logits."""
    from zoo import cells

    outcome, fixed = cells.fix(family, ROUTE, tmp_path)
    assert outcome.ok, outcome.short()
    kv = cells.kvcache(family, ROUTE, fixed, tmp_path)
    assert kv.ok, kv.short()
