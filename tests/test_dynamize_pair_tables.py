"""`--pair` and the tables pnnx folds at the traced length (issue 24, item 3): a BERT-like
export traced at T=6 (fixtures/encoder/learned_pos) with a second export of the same model
at T=9, written here as pnnx writes it (tools/fixtures_encoder.py's graph at 9). The uniform
token-type table needs only the input's rows (its one row, broadcast); the learned position
table takes the pair's 9 rows, cropped at run time to the length: ncnn equals the model at
T = 3, 8 (no trace used them) and 9. Without the pair's weights the refusal names the
position table, `--pair-bin` and the export that keeps the whole table."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.formats.weights import set_weights
from paramsurgery.runtime.child import Feed, Fetch, run

REPO = Path(__file__).resolve().parent.parent
ENC = REPO / "fixtures" / "encoder"
sys.path.insert(0, str(REPO / "tools"))
import fixtures_encoder as fe  # noqa: E402

T2 = 9


def _pair(tmp: Path, with_bin: bool) -> tuple[Path, dict]:
    """The model's export at T2 (params as pnnx writes them at that length), its IR, and
    (with_bin) its weights: the position table's first 6 rows are the input's."""
    t0 = fe.T0
    text = fe.LEARNED_POS.replace(f"1={t0}", f"1={T2}").replace(f"0={t0} 1=", f"0={T2} 1=") \
        .replace(f"7={t0} ", f"7={T2} ").replace(f"2={t0}\n", f"2={T2}\n")
    assert text.count(f"={t0}") == 0  # every length-derived value moved
    w = fe.learned_pos_weights()
    w["pos"] = np.vstack([w["pos"], np.random.default_rng(9).standard_normal(
        (T2 - t0, fe.HIDDEN)).astype(np.float32)])
    g = paramsurgery.loads(text)
    set_weights(g.layer("pnnx_fold_61"), {"data": np.tile(w["type_row"], T2)})
    set_weights(g.layer("pnnx_fold_63"), {"data": w["pos"].reshape(-1)})
    set_weights(g.layer("pnnx_fold_attention_mask.1"), {"data": np.zeros(T2 * T2, np.float32)})
    set_weights(g.layer("gemm_0"), {"B": w["B"], "C": w["C"].reshape(1, -1)})
    param = tmp / "pair.ncnn.param"
    if with_bin:
        paramsurgery.save(g, param, bin=tmp / "pair.ncnn.bin")
    else:
        param.write_text(text)
    (tmp / "pair.pnnx.param").write_text(fe.LEARNED_POS_PNNX.replace(f"({1},{t0},", "(1,9,")
                                         .replace(f"(1,{t0},", f"(1,{T2},"))
    return param, w


def _dynamize(tmp: Path, pair: Path, *extra: str) -> int:
    return main(["dynamize", str(ENC / "learned_pos.ncnn.param"), "--bin",
                 str(ENC / "learned_pos.ncnn.bin"), "--pnnx", str(ENC / "learned_pos.pnnx.param"),
                 "--pair", str(pair), "--pair-pnnx", str(tmp / "pair.pnnx.param"), *extra,
                 "-o", str(tmp / "out.param")])


def test_pair_without_its_weights_names_the_position_table_and_pair_bin(tmp_path, capsys):
    pair, _ = _pair(tmp_path, with_bin=False)
    assert _dynamize(tmp_path, pair) == 2
    err = capsys.readouterr().err
    assert "pnnx_fold_63: MemoryData 1=6, a table traced at one length added to '3'" in err
    assert "give --pair-bin OTHER.bin" in err and "inputshape2=" in err
    assert "pnnx_fold_61" not in err  # the uniform table needs no pair rows
    assert not (tmp_path / "out.param").exists()


@pytest.mark.parametrize("t", [3, 8, T2])
def test_pair_with_its_weights_crops_the_longer_table_at_run_time(tmp_path, capsys, t):
    pair, w = _pair(tmp_path, with_bin=True)
    assert _dynamize(tmp_path, pair, "--pair-bin", str(tmp_path / "pair.ncnn.bin")) == 0
    out = capsys.readouterr().out
    assert "pnnx_fold_61: uniform table (its 6 rows are one row)" in out
    assert "pnnx_fold_63: a position table of 9 rows: the result is exact for lengths up to 9" \
        in out
    x = np.random.default_rng(t).standard_normal((t, fe.HIDDEN)).astype(np.float32)
    got = run((tmp_path / "out.param").read_text(), tmp_path / "out.bin",
              {"in0": Feed(x)}, [Fetch("out0")])["out0"]
    want = fe.learned_pos_forward(x, w)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("family,route,layer", [
    ("gpt2", "embeds_sdpa_static", "pnnx_fold_position_embeds.1"),  # learned table, 7 rows
    ("vit", "x_sdpa_static", "conv_6"),                   # the patch count is not linear in T
])
def test_refusals_name_the_layer_and_the_export_that_fixes_it(tmp_path, capsys, family,
                                                              route, layer):
    """`fix` with the reference next to a static zoo export (T=11, 24 for ViT): refused,
    naming the layer and pnnx's inputshape2= export (whose fix runs right: the zoo table)."""
    z = REPO / "fixtures" / "zoo" / family
    code = main(["fix", str(z / f"{route}.ncnn.param"), "--bin", str(z / f"{route}.ncnn.bin"),
                 "-o", str(tmp_path / "f.param")])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "f.param").exists()
    assert repr(layer) in err or f" {layer}:" in err, err
    assert "export with pnnx inputshape2=" in err, err
