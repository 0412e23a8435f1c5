"""Raw (unpatched HF) Qwen3-TTS exports repaired by `paramsurgery fix` alone (the issue's
command: `fix X.ncnn.param --bin X.ncnn.bin -o Y.param`), checked in ncnn against torch at
the `ref.npz` length (no trace used it), with the manifest's `io` (batch_index) conventions;
real-size raw params through the same `fix` load in ncnn (`tools/qwen3tts/rawfix.py` prints
the before/after table).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.formats.weights.synth import synth_size, write_synth_bin

from conftest import FIXTURES, REPO
from golden import check_golden

sys.path.insert(0, str(REPO / "tools"))
from qwen3tts.ncnn_check import check, check_loads  # noqa: E402
from qwen3tts.rawfix import raw_variant, run_fix  # noqa: E402

QWEN = FIXTURES / "qwen3_tts"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
RAW_TINY = {r["module"]: r for r in MANIFEST["qwen3_tts"]["exports"]
            if r["size"] == "tiny" and r["variant"] == "raw" and "io" in r}
RAW_REAL = sorted(p for p in (QWEN / "real").glob("*.raw.ncnn.param"))
NEEDS_REPAIR = ("talker_decoder", "predictor_decoder", "mimi_encoder", "speaker_encoder",
                "codec_decoder")


RUNNABLE = sorted(RAW_TINY) + ["codec_decoder"]


def _report(text: str) -> str:
    """fix's report without the lines naming the temporary output files, and without the
    reference check fix now runs by default (its path is the checkout's: asserted apart)."""
    return "\n".join(ln for ln in text.splitlines()
                     if not ln.startswith(("weights:", "wrote ", "verify against "))) + "\n"


@pytest.mark.parametrize("module", RUNNABLE)
def test_raw_tiny_fixed_runs_right_at_untraced_length(module: str, tmp_path: Path) -> None:
    variant = raw_variant(module)
    rec = RAW_TINY.get(module) or next(
        r for r in MANIFEST["qwen3_tts"]["exports"]
        if (r["module"], r["variant"], r["size"]) == (module, variant, "tiny") and "io" in r)
    # what pnnx gave: the ones that need repairs fail to load, the rest run as exported
    assert (rec["status"]["kind"] == "load_fails") == (module in NEEDS_REPAIR)
    param = QWEN / "tiny" / f"{module}.{variant}.ncnn.param"
    out = tmp_path / "y.param"
    # the codec: one trace (T=25) + the reference next to it (T=13), --verify'd by fix
    extra = ("--verify",) if module == "codec_decoder" else ()
    code, text = run_fix(param, param.with_suffix(".bin"), out, *extra)
    assert code == 0, text
    assert (" change(s)" in text) == (module in NEEDS_REPAIR)
    out_bin = tmp_path / "y.bin"
    if module not in NEEDS_REPAIR:  # nothing to repair: nothing written, the input runs
        assert "nothing to change; no file written" in text and not out.exists()
        out, out_bin = param, param.with_suffix(".bin")
    if module == "codec_decoder":
        assert re.search(r"verify against \S+codec_decoder.raw_static.ref.npz: ok: out0 rel ",
                         text), text
        assert "repairs called for: fix-slice, dynamize" in text
        assert "dynamize: 34 change(s)" in text
        assert "exact for lengths up to 25 (--pair OTHER.param extends it)" in text
    if module in NEEDS_REPAIR:  # a reference next to the input: fix checked it, --verify or not
        assert re.search(rf"verify against \S+{module}\.{variant}\.ref\.npz: ok: ", text), text
        check_golden(f"rawfix/{module}.param" if variant == "raw" else
                     f"fix/fix.{module}.{variant}.param", out.read_text())
        if variant == "raw":
            check_golden(f"rawfix/{module}.txt", _report(text))
    arrays = dict(np.load(QWEN / "tiny" / f"{module}.{variant}.ref.npz"))
    lengths = rec["lengths"]
    assert lengths["reference"] not in (lengths["trace"], lengths["trace2"])
    st = check(out, out_bin, rec["io"]["inputs"], rec["io"]["outputs"], arrays)
    assert st["kind"] == "runs_right", st
    assert st["max_rel_err"] <= 1e-4


SYNTH_LIMIT = 400 << 20  # real-size params whose synth-bin is smaller get one (lower's tables)


def test_raw_codec_decoder_pair_fallback_gives_the_two_trace_result(tmp_path: Path) -> None:
    """pnnx aborts re-tracing the raw decoder at a second shape; its static trace at T=25
    fails to load (Slice 1=-233 of the codes' level axis). `fix --pair` with the T=50 trace
    writes what `dynamize --pair` proves from the two traces (position tables of 50 rows),
    and runs right at T=13."""
    recs = {r["variant"]: r for r in MANIFEST["qwen3_tts"]["exports"]
            if r["module"] == "codec_decoder" and r["size"] == "tiny"}
    assert recs["raw"]["status"]["kind"] == "pnnx_failed"
    assert recs["raw_static"]["status"]["kind"] == "load_fails"
    assert (recs["raw_static"]["lengths"]["trace"], recs["raw_static_pair"]["lengths"]["trace"],
            recs["raw_static"]["lengths"]["reference"]) == (25, 50, 13)
    param = QWEN / "tiny" / "codec_decoder.raw_static.ncnn.param"
    out = tmp_path / "y.param"
    code, text = run_fix(param, param.with_suffix(".bin"), out, "--pair",
                         str(QWEN / "tiny" / "codec_decoder.raw_static_pair.ncnn.param"))
    assert code == 0, text
    check_golden("rawfix/codec_decoder.param", out.read_text())
    assert text.count("the paired export's 50 rows") == 2
    arrays = dict(np.load(QWEN / "tiny" / "codec_decoder.raw_static.ref.npz"))
    io = recs["raw_static"]["io"]
    st = check(out, tmp_path / "y.bin", io["inputs"], io["outputs"], arrays)
    assert st["kind"] == "runs_right", st


def _lower(param: Path):  # noqa: ANN202 - (graph, results, failures)
    """lower alone, not partial (as `paramsurgery lower` runs it): its refusal names why."""
    from paramsurgery.pipeline.manager import PassManager
    from paramsurgery.passes.lower import Lower

    g = paramsurgery.load(param, bin=param.with_suffix(".bin"))
    return PassManager([Lower(traced=param.with_name(param.name.replace(
        ".ncnn.param", ".pnnx.param")))], early_stop=False).run(g)


def test_raw_speaker_encoder_fixed_by_the_cli_matches_torch(tmp_path: Path) -> None:
    """`paramsurgery fix X.raw.ncnn.param --bin X.raw.ncnn.bin -o Y.param --verify`: the
    ECAPA length mask (`_length_to_mask(lengths * x.shape[-1])`, pnnx folded the product and
    `mask.sum()` at the first trace, T=300) is rebuilt from the input's extent, read from
    pnnx's own record of the trace (speaker_encoder.raw_ncnn.py), and the result matches
    torch at T=211."""
    from paramsurgery.cli import main

    param = QWEN / "tiny" / "speaker_encoder.raw.ncnn.param"
    out = tmp_path / "y.param"
    assert main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o", str(out),
                 "--verify"]) == 0
    rec = RAW_TINY["speaker_encoder"]
    assert rec["lengths"]["reference"] not in (300, 173) and rec["lengths"]["trace"] == 300
    st = check(out, tmp_path / "y.bin", rec["io"]["inputs"], rec["io"]["outputs"],
               dict(np.load(QWEN / "tiny" / "speaker_encoder.raw.ref.npz")))
    assert st["kind"] == "runs_right" and st["max_rel_err"] <= 1e-4, st


def test_raw_speaker_encoder_without_the_trace_record_is_refused(tmp_path: Path) -> None:
    """Without pnnx's X_ncnn.py (or --traced-len) nothing says the folded 300 is the traced
    length: the comparison is refused, naming the constant and what would let it proceed."""
    import shutil

    for suffix in (".ncnn.param", ".ncnn.bin", ".pnnx.param"):
        shutil.copy(QWEN / "tiny" / f"speaker_encoder.raw{suffix}", tmp_path)
    param = tmp_path / "speaker_encoder.raw.ncnn.param"
    g, _, failures = _lower(param)
    assert [name for name, _ in failures] == ["lower"]
    msg = failures[0][1]
    assert msg.startswith("torch.lt 'torch.lt_5' (compare): compares with 'pnnx_fold_270' = "
                          "300, a constant pnnx folded from the first trace")
    assert "keep pnnx's X_ncnn.py next to X.ncnn.param, or give --traced-len T" in msg
    assert "Tensor.masked_fill 'Tensor.masked_fill_38' (masked_fill): its mask is not " \
           "proven constant" in msg
    # the flag the refusal names lets it proceed (dynamize, also asked, finds nothing)
    from paramsurgery.cli import main

    assert main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o",
                 str(tmp_path / "y.param"), "--traced-len", "300", "--verify", "--reference",
                 str(QWEN / "tiny" / "speaker_encoder.raw.ref.npz")]) == 0


FAST_REAL = ("mimi_encoder", "speaker_encoder")  # the rest: -m slow (10-20 s each)
RAW_REAL_FIX = RAW_REAL + [QWEN / "real" / "codec_decoder.raw_static.ncnn.param"]


def kept_folds(param: Path) -> dict[str, np.ndarray]:
    """The constants pnnx folded from its trace, kept from a real-size raw export whose
    weights were not (`X.folds.npz`; the generator keeps them and pnnx's `X_ncnn.py`)."""
    path = param.with_name(param.name.replace(".ncnn.param", ".folds.npz"))
    return dict(np.load(path)) if path.exists() else {}


@pytest.mark.parametrize("param", [p if p.name.split(".")[0] in FAST_REAL
                                   else pytest.param(p, marks=pytest.mark.slow)
                                   for p in RAW_REAL_FIX], ids=lambda p: p.name.split(".")[0])
def test_raw_real_params_fixed_load(param: Path, tmp_path: Path) -> None:
    """`paramsurgery fix` on the real-size raw params (no weights kept: synth-bin's stand in
    where a repair writes weights and the graph is small enough; else the param alone); ncnn
    loads each result (child process). The codec decoder's static trace: fix-slice (no
    reference at real size, so no length to dynamize to)."""
    bin_path = None
    g0 = paramsurgery.load(param)
    if synth_size(g0) < SYNTH_LIMIT:
        bin_path = tmp_path / "synth.bin"
        with open(bin_path, "wb") as fh:
            write_synth_bin(g0, fh, given=kept_folds(param))
    assert check_loads(param)["kind"] == "load_fails" or param.name.split(".")[0] not in \
        NEEDS_REPAIR
    out = tmp_path / "y.param"
    code, text = run_fix(param, bin_path, out)
    assert out.exists(), text
    assert code == 0, text
    assert check_loads(out)["kind"] == "loads"


def test_raw_real_speaker_encoder_thaws_the_kept_trace_length(tmp_path: Path) -> None:
    """Real size: the kept folded constants (300 = the first trace's mel frames, read from the
    export's weights) and pnnx's script make `fix` rebuild the length mask as at tiny size;
    the fixed graph runs in ncnn at a length no trace used (synth weights: no reference).
    With random values in place of the kept ones the thaw is refused, naming the value."""
    param = QWEN / "real" / "speaker_encoder.raw.ncnn.param"
    folds = kept_folds(param)
    assert {k: v.tolist() for k, v in folds.items()} == {"pnnx_fold_366": [300.0],
                                                          "pnnx_fold_total.1": [300.0]}
    g0 = paramsurgery.load(param)
    for given, name in ((folds, "kept"), ({}, "random")):
        bin_path = tmp_path / f"{name}.bin"
        with open(bin_path, "wb") as fh:
            write_synth_bin(g0, fh, given=given)
        code, text = run_fix(param, bin_path, tmp_path / f"{name}.param")
        if given:
            assert code == 0, text
            assert text.count("a constant pnnx folded at the first trace = in0 dim 1 there "
                              "(300, speaker_encoder.raw_ncnn.py)") == 2, text
        else:  # errors left that no repair handles: refused, nothing written
            assert code == 2, text
            assert "is not the traced extent of a dynamic input dim (in0 dim 1 = 300" in text
            assert "refusing to write" in text and not (tmp_path / f"{name}.param").exists()
    import ncnn

    net = ncnn.Net()
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
    assert net.load_param(str(tmp_path / "kept.param")) == 0
    assert net.load_model(str(tmp_path / "kept.bin")) == 0
    mels = np.random.default_rng(0).standard_normal((211, 128)).astype(np.float32)
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(mels).clone())
    ret, out = ex.extract("out0")
    assert ret == 0
    xvector = np.array(out)
    assert xvector.size > 0 and np.isfinite(xvector).all()
