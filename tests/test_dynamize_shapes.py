"""dynamize from one static trace (`dynamize_shapes.py`): the traced length a symbol of the
shape analysis, the length to run at taken from a reference. Same text as the --traced-len /
--pair modes on the repairs fixtures, ncnn numbers at the reference's (untraced) length,
refusals naming the layer and `--pair`, and `fix` alone on the raw static Qwen3-TTS codec
decoder (tests/test_rawfix_qwen3tts.py; here: with `--pair` as the fallback that extends
its position tables)."""

import json

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.formats.pnnx_traced import pnnx_op
from paramsurgery.passes.dynamize import Dynamize
from paramsurgery.passes.dynamize_shapes import reference_shapes
from paramsurgery.runtime.child import Feed, Fetch, run, run_isolated

from conftest import FIXTURES
from golden import check_golden
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps
from paramsurgery.formats.pnnx_traced import load_traced

R = FIXTURES / "repairs"
TINY = FIXTURES / "qwen3_tts" / "tiny"


def single_trace(d):
    ref = reference_shapes(str(d / "ref.npz"))
    return Dynamize(traced=load_traced(d / "model.pnnx.param"), reference=(*ref, str(d / "ref.npz")))


@pytest.mark.parametrize("model", ["attention", "neg_slice"])
def test_one_trace_writes_what_two_traces_prove(model, tmp_path):
    """The same text as `--traced-len` and `--pair` (tests/golden/fix/dynamize.*), and ncnn
    at the reference's length (T=13; traced at 10) equal to torch."""
    d = R / model / "static10"
    res = single_trace(d)(paramsurgery.load(d / "model.ncnn.param"))
    check_golden(f"fix/dynamize.{model}.param", dumps(res.graph))
    assert all(k in c.what for c in res.changes for k in [("measures" if "gemm" in c.layer else "elements" if "reshape" in c.layer else "input extent")])
    meta = json.loads((d / "meta.json").read_text())
    ref = np.load(d / "ref.npz")
    save(res.graph, tmp_path / "d.param")
    got = run(tmp_path / "d.param", d / "model.ncnn.bin",
              {"in0": Feed(ref["in0"], meta["input_batch_index"]["in0"])},
              [Fetch("out0", meta["output_batch_index"]["out0"])])["out0"]
    np.testing.assert_allclose(got, ref["out0"], atol=1e-5, rtol=1e-5)


def test_report_says_what_proves_each_value():
    res = single_trace(R / "attention" / "static10")(
        paramsurgery.load(R / "attention" / "static10" / "model.ncnn.param"))
    lines = [c.format() for c in res.changes]
    assert "line 5: gemm_0: 7 (runtime size (0): the operand measures T): 10 -> 0" in lines
    assert ("line 16: reshape_7: 1(h) (inferred (-1): the input's 32*T elements make it T): "
            "10 -> -1") in lines


def _static(text: str, in_shape: tuple, ref_in: tuple, ref_out: tuple):
    g = paramsurgery.loads(text, "m.param")
    ops = [pnnx_op("pnnx.Input", "pnnx_input_0", [], ["0"], shapes={"0": (in_shape, "f32")})]
    return g, Dynamize(traced=ops, reference=([ref_in], [ref_out], "ref.npz"))


def test_ambiguous_reshape_is_refused_naming_the_layer_and_pair():
    """Traced at T=4 with 4 heads: (T, 16) → (T, 4, 4) could infer either 4."""
    g, p = _static("7767517\n2 2\nInput in0 0 1 in0\nReshape r 1 1 in0 out0 0=4 1=4 2=4\n",
                   (4, 16), (6, 16), (6, 4, 4))
    with pytest.raises(PassRefused) as exc:
        p(g)
    msg = exc.value.message
    assert msg.startswith("r: the input has 16*T elements and ambiguous: several dims")
    assert "--pair" in msg


def test_literal_crop_end_is_refused_by_the_reference_outputs():
    """`x[..., :5]` traced at 10: taken at its distance from the end it would measure T-5;
    the reference says 5 at T=13, so the rewrite is refused, naming the Crop."""
    g, p = _static("7767517\n2 2\nInput in0 0 1 in0\n"
                   "Crop c 1 1 in0 out0 -23309=1,0 -23310=1,5 -23311=1,1\n",
                   (1, 4, 10), (1, 4, 13), (1, 4, 5))
    with pytest.raises(PassRefused) as exc:
        p(g)
    assert "a Crop end among c is not a distance from the end" in exc.value.message
    g, p = _static("7767517\n2 2\nInput in0 0 1 in0\n"
                   "Crop c 1 1 in0 out0 -23309=1,0 -23310=1,5 -23311=1,1\n",
                   (1, 4, 10), (1, 4, 13), (1, 4, 8))
    assert [c.format() for c in p(g).changes] == [
        "line 4: c: 10[0] (relative to the end: input extent T = 10): 5 -> -5"]


def test_a_table_that_is_not_cos_sin_is_refused():
    from paramsurgery.formats.weights import set_weights

    g = paramsurgery.loads("7767517\n4 4\nInput in0 0 1 in0\nMemoryData c 0 1 c 0=4 1=6\n"
                           "MemoryData s 0 1 s 0=4 1=6\nRotaryEmbed r 3 1 in0 c s out0 0=0\n",
                           "m.param")
    rng = np.random.default_rng(0)
    for name in "cs":
        set_weights(g.layer(name), {"data": rng.standard_normal(24).astype(np.float32)})
    ops = [pnnx_op("pnnx.Input", "pnnx_input_0", [], ["0"], shapes={"0": ((2, 6, 8), "f32")})]
    p = Dynamize(traced=ops, reference=([(2, 9, 8)], [(2, 9, 8)], "ref.npz"))
    with pytest.raises(PassRefused, match=r"c: not proven a position table: its rows are not "
                                          r"cos/sin of p·θ .*--pair"):
        p(g)


# ------------------------------------------------------------------ the raw codec decoder

def _codec_io():
    rec = next(r for r in json.loads((FIXTURES / "manifest.json").read_text())["qwen3_tts"]
               ["exports"] if (r.get("module"), r.get("variant"), r.get("size")) ==
               ("codec_decoder", "raw_static", "tiny") and "ncnn_bin" in r.get("files", {}))
    return rec["io"]


def _run_codec(param, bin_path, codes, mask, io):
    arrays = {"input_codes": codes, "input_mask": mask}
    res = run_isolated(param, bin_path,
                       {i["blob"]: Feed(arrays[i["key"]], i["batch_index"]) for i in io["inputs"]},
                       [Fetch(o["blob"], o["batch_index"]) for o in io["outputs"]])
    assert res.ok, res.describe()
    return res.outputs["out0"]


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.slow
def test_fix_pair_fallback_extends_the_codec_tables(tmp_path, capsys):
    """With `--pair` (T=50; its .bin forwarded from --bin) the position tables grow to 50
    rows: torch's numbers at T=13, the single-trace result's at T=20, and T=40 runs."""
    from paramsurgery.cli import main

    stem = TINY / "codec_decoder.raw_static"
    one, two = tmp_path / "one.param", tmp_path / "two.param"
    assert main(["fix", f"{stem}.ncnn.param", "--bin", f"{stem}.ncnn.bin", "-o", str(one)]) == 0
    assert main(["fix", f"{stem}.ncnn.param", "--bin", f"{stem}.ncnn.bin", "-o", str(two),
                 "--pair", str(TINY / "codec_decoder.raw_static_pair.ncnn.param")]) == 0
    out = capsys.readouterr().out
    assert "the paired export's 50 rows" in out and "weights: rewritten" in out
    io = _codec_io()
    ref = np.load(f"{stem}.ref.npz")
    got = _run_codec(two, two.with_suffix(".bin"), ref["input_codes"], ref["input_mask"], io)
    assert _rel(got, ref["output_wav"]) <= 1e-4
    rng = np.random.default_rng(3)
    for t in (20, 40):
        codes = rng.integers(0, 16, (1, 16, t)).astype(np.int32)
        mask = np.triu(np.full((t, t), -1e9, np.float32), 1).reshape(1, 1, t, t)
        b = _run_codec(two, two.with_suffix(".bin"), codes, mask, io)
        assert b.shape == (1, 1, 1920 * t)
        if t <= 25:
            a = _run_codec(one, one.with_suffix(".bin"), codes, mask, io)
            assert _rel(a, b) <= 1e-6


def test_fix_declares_the_pair_inputs_of_dynamize(tmp_path, capsys):
    """fix's extra flags are the repairs' declarations, not a list in fix; a file one names
    that does not exist is an input error (exit 2, nothing written)."""
    from paramsurgery.cli import main
    from paramsurgery.pipeline.fix import fix_inputs

    assert [f for f in fix_inputs()] == ["--traced-len", "--pair", "--pair-bin", "--pair-pnnx"]
    assert all(i.help for i in Dynamize.fix_inputs)
    d = R / "attention" / "static10"
    out = tmp_path / "o.param"
    assert main(["fix", str(d / "model.ncnn.param"), "-o", str(out),
                 "--pair-bin", str(tmp_path / "none.bin")]) == 2
    assert "none.bin: --pair-bin: no such file" in capsys.readouterr().err
    assert not out.exists()


def test_cli_reference_mode(tmp_path, capsys):
    """`paramsurgery dynamize X --reference REF.npz`: the one-trace mode from the command
    line; a reference it cannot read is an input error (exit 2, nothing written)."""
    from paramsurgery.cli import main

    d = R / "attention" / "static10"
    out = tmp_path / "d.param"
    assert main(["dynamize", str(d / "model.ncnn.param"), "--reference", str(d / "ref.npz"),
                 "-o", str(out)]) == 0
    assert "dynamize: 8 change(s)" in capsys.readouterr().out
    check_golden("fix/dynamize.attention.param", out.read_text())
    # fix finds ref.npz next to the file (T=13, traced at 10) and --verify pairs it by order
    assert main(["fix", str(d / "model.ncnn.param"), "--bin", str(d / "model.ncnn.bin"),
                 "-o", str(tmp_path / "f.param"), "--verify"]) == 0
    text = capsys.readouterr().out
    assert "repairs called for: dynamize" in text and "ref.npz: ok: out0 rel" in text
    check_golden("fix/dynamize.attention.param", (tmp_path / "f.param").read_text())
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    assert main(["dynamize", str(d / "model.ncnn.param"), "--reference", str(bad),
                 "-o", str(tmp_path / "e.param")]) == 2
    assert "bad.npz: cannot read" in capsys.readouterr().err
    assert not (tmp_path / "e.param").exists()


def test_reshape_dims_that_copy_the_input_count_as_its_extent():
    """`0` copies the input's extent: (T, 16) → (h=4, w=0) traced at T=4 has its h derived
    from the length (the only dim left to infer), while (h=0, w=0) already follows the input
    and stays."""
    g, p = _static("7767517\n2 2\nInput in0 0 1 in0\nReshape r 1 1 in0 out0 0=0 1=4\n",
                   (4, 16), (6, 16), (6, 16))
    assert [c.format() for c in p(g).changes] == [
        "line 4: r: 1(h) (inferred (-1): the input's 16*T elements make it T): 4 -> -1"]
    g, p = _static("7767517\n2 2\nInput in0 0 1 in0\nReshape r 1 1 in0 out0 0=0 1=0\n",
                   (4, 16), (6, 16), (6, 16))
    assert not p(g).modified


def test_a_traced_length_where_the_shapes_are_unknown_is_refused():
    """No rule knows what a leftover outputs: a Reshape after it holding the traced length
    (10) cannot be proven either way, so the one-trace rewrite refuses, naming it."""
    g, p = _static("7767517\n3 3\nInput in0 0 1 in0\ntorch.foo f 1 1 in0 a\n"
                   "Reshape r 1 1 a out0 0=4 1=10\n", (10, 4), (13, 4), (13, 4))
    with pytest.raises(PassRefused, match=r"r: a param equals the traced length 10 but the "
                                          r"shape analysis does not know the input's shape"):
        p(g)
