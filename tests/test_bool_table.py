"""pnnx's bool MemoryData (`21=3`, one byte per value: GPT-2's eager causal mask) and the
`torch.where` that reads it (issue 24): `fix-bool-table` writes the table as float32 0/1,
which ncnn loads, and `lower` rewrites `where(m, x, finfo.min)` as min(x, (2m-1)·FLT_MAX).
Numbers through ncnn at lengths no trace used against numpy's where, then the zoo's GPT-2
eager export at its traced length against torch."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.core.errors import PassRefused
from paramsurgery.formats.param_text import dumps
from paramsurgery.formats.weights import set_weights
from paramsurgery.lint import lint_graph
from paramsurgery.passes.fix_bool_table import FixBoolTable
from paramsurgery.passes.lower import Lower
from paramsurgery.runtime.child import Feed, Fetch, NcnnRunError, run

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "fixtures" / "zoo" / "gpt2"
FLT_MAX = float(np.finfo(np.float32).max)
N = 16  # the table's side: the graph crops it to the input's (T, T), T <= N

# GPT-2's eager attention as pnnx's dynamic export writes it: the `bias` buffer (a bool
# (N, N) tril) cropped to the scores' extent, `where(mask, scores, mask_value)`
PARAM = f"""7767517
6 7
Input in0 0 1 in0
Split splitncnn_0 1 2 in0 x0 x1
MemoryData bias 0 1 m0 0={N} 1={N} 21=3
Crop crop 2 1 m0 x0 m1
MemoryData mask_value 0 1 mv 0=1
torch.where where 3 1 m1 x1 mv out0
"""


def _bin(mask: np.ndarray) -> bytes:
    raw = mask.astype(np.uint8).tobytes()
    raw += b"\0" * (-len(raw) % 4)  # pnnx pads the bytes to 4 (measured on the zoo's GPT-2)
    return raw + np.float32(-FLT_MAX).tobytes()


def _graph(tmp_path: Path, mask: np.ndarray) -> paramsurgery.Graph:
    (tmp_path / "m.param").write_text(PARAM)
    (tmp_path / "m.bin").write_bytes(_bin(mask))
    return paramsurgery.load(tmp_path / "m.param", bin=tmp_path / "m.bin")


def _scores(t: int) -> np.ndarray:
    x = np.random.default_rng(t).standard_normal((t, t)).astype(np.float32) * 4
    x[0, 0], x[-1, 0], x[1, 1] = 3e38, -3e38, 1e30  # finite extremes: min selects them too
    return x


@pytest.mark.parametrize("t", [5, 11])
def test_bool_table_and_where_run_like_torch_at_any_length(tmp_path, t) -> None:
    tril = np.tril(np.ones((N, N), bool))
    g = _graph(tmp_path, tril)
    codes = {f.code for f in lint_graph(g, run=False)}
    assert {"PS020", "PS004"} <= codes
    with pytest.raises(NcnnRunError):  # ncnn: "ModelBin load type 3 not implemented"
        run(dumps(g), tmp_path / "m.bin", {"in0": Feed(_scores(t))}, [Fetch("out0")])
    fixed = FixBoolTable()(g)
    assert fixed.modified and "21=" not in dumps(fixed.graph).split("bias", 1)[1].split("\n")[0]
    lowered = Lower()(fixed.graph)
    assert lowered.modified and not {"PS004", "PS020"} & {
        f.code for f in lint_graph(lowered.graph, run=False)}
    paramsurgery.save(lowered.graph, tmp_path / "y.param", bin=tmp_path / "y.bin")
    x = _scores(t)
    got = run((tmp_path / "y.param").read_text(), tmp_path / "y.bin", {"in0": Feed(x)},
              [Fetch("out0")])["out0"]
    want = np.where(tril[:t, :t], x, np.float32(-FLT_MAX))
    assert got.shape == want.shape
    assert np.array_equal(got, want)  # exact, extremes included


def test_where_of_anything_but_a_0_1_mask_and_finfo_min_is_declined(tmp_path) -> None:
    g = _graph(tmp_path, np.tril(np.ones((N, N), bool)))
    g = FixBoolTable()(g).graph
    set_weights(g.layer("mask_value"), {"data": np.array([-1e4], np.float32)})  # another fill
    res = Lower(partial=True)(g)
    assert not res.modified
    assert "not -FLT_MAX" in " ".join(s.reason for s in res.skipped)


def test_fix_bool_table_refuses_bytes_that_are_not_bools(tmp_path) -> None:
    mask = np.tril(np.ones((N, N), np.uint8))
    mask[3, 9] = 2
    with pytest.raises(PassRefused, match="'bias'.*holds 2 at element 57: not a bool"):
        FixBoolTable()(_graph(tmp_path, mask))


def test_gpt2_eager_static_runs_right_at_its_length_and_fix_names_the_mask(tmp_path,
                                                                            capsys) -> None:
    """The zoo's GPT-2 eager static export: fix-bool-table, lower (the where), then the
    tied head and the pow: ncnn equals torch at T=7 (its traced length; without fix-pow it
    is 0.56 off, so the run can fail). `fix` itself then refuses naming the bool mask
    (traced at 7×7: right at T=7 only) rather than write a graph wrong at other lengths."""
    sys.path.insert(0, str(REPO / "tools"))
    from zoo import cells

    src, b = ZOO / "embeds_eager_static.ncnn.param", ZOO / "embeds_eager_static.ncnn.bin"
    steps = [["fix-bool-table"], ["lower", "--pnnx", str(ZOO / "embeds_eager_static.pnnx.param")],
             ["fix-tied-linear"], ["fix-pow"]]
    for i, step in enumerate(steps):
        out = tmp_path / f"s{i}.param"
        assert main([step[0], str(src), "--bin", str(b), "-o", str(out), *step[1:]]) == 0
        src, b = out, out.with_suffix(".bin")
    capsys.readouterr()
    errors, first = cells.run_at_lengths(src, b, "gpt2", "embeds_eager_static", [7])
    assert errors[7] <= 1e-5, first
    code = main(["fix", str(ZOO / "embeds_eager_static.ncnn.param"), "--bin",
                 str(ZOO / "embeds_eager_static.ncnn.bin"), "-o", str(tmp_path / "f.param")])
    text = capsys.readouterr()
    assert code == 2 and not (tmp_path / "f.param").exists()
    assert "pnnx_fold_causal_mask.2" in text.out + text.err


def test_fix_repairs_the_repro_case_at_an_untraced_length(tmp_path, capsys) -> None:
    """The catalogue's `bool-mask-buffer` bug (fixtures/repros: a dynamic export traced at
    T=7 and 5, GPT-2's eager `where(bias[..., :T, :T], s, finfo.min)` before a softmax):
    `fix` runs fix-bool-table and lower, and the result equals torch at T=9 (its ref.npz)."""
    d = REPO / "fixtures" / "repros" / "bool-mask-buffer" / "bug"
    out = tmp_path / "y.param"
    assert main(["fix", str(d / "model.ncnn.param"), "--bin", str(d / "model.ncnn.bin"),
                 "--reference", str(d / "ref.npz"), "--verify", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "repairs called for: fix-bool-table, lower" in text and ": ok: out0 rel" in text
    with np.load(d / "ref.npz") as z:
        x, want = z["in0"], z["out0"]
    assert x.shape[-1] == 9
    got = run(out.read_text(), out.with_suffix(".bin"), {"in0": Feed(x, 0)},
              [Fetch("out0", 0)])["out0"]
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-6
