"""Raw (unpatched HF) Qwen3-TTS exports repaired by graph surgery alone, checked in ncnn
against torch at the `ref.npz` length (no trace used it), with the manifest's `io`
(batch_index) conventions; real-size raw params through the same repairs load in ncnn.

Until `paramsurgery fix` runs every registered repair, the repairs are chained through the
Python API in the order `fix` runs them (`tools/qwen3tts/rawfix.py`, which also prints the
before/after table).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.passes.dynamize import Dynamize
from paramsurgery.weights.synth import synth_size, write_synth_bin

from conftest import FIXTURES, REPO
from golden import check_golden

sys.path.insert(0, str(REPO / "tools"))
from qwen3tts.ncnn_check import check, check_loads  # noqa: E402
from qwen3tts.rawfix import repair, static_codec  # noqa: E402

QWEN = FIXTURES / "qwen3_tts"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
RAW_TINY = {r["module"]: r for r in MANIFEST["qwen3_tts"]["exports"]
            if r["size"] == "tiny" and r["variant"] == "raw" and "io" in r}
RAW_REAL = sorted(p for p in (QWEN / "real").glob("*.raw.ncnn.param"))
NEEDS_REPAIR = ("talker_decoder", "predictor_decoder", "mimi_encoder", "speaker_encoder")


RUNNABLE = sorted(RAW_TINY)


@pytest.mark.parametrize("module", RUNNABLE)
def test_raw_tiny_repaired_runs_right_at_untraced_length(module: str, tmp_path: Path) -> None:
    rec = RAW_TINY[module]
    # what pnnx gave: the three that need repairs fail to load, the rest run as exported
    assert (rec["status"]["kind"] == "load_fails") == (module in NEEDS_REPAIR)
    param = QWEN / "tiny" / f"{module}.raw.ncnn.param"
    g, results, failures = repair(param, param.with_suffix(".bin"))
    assert failures == []
    assert any(r.modified for r in results) == (module in NEEDS_REPAIR)
    out = tmp_path / "y.param"
    g.save(out, tmp_path / "y.bin")
    if module in NEEDS_REPAIR:
        check_golden(f"rawfix/{module}.param", g.dumps())
        check_golden(f"rawfix/{module}.txt",
                     "\n".join(r.format(True) for r in results if r.modified) + "\n")
    arrays = dict(np.load(QWEN / "tiny" / f"{module}.raw.ref.npz"))
    lengths = rec["lengths"]
    assert lengths["reference"] not in (lengths["trace"], lengths["trace2"])
    st = check(out, tmp_path / "y.bin", rec["io"]["inputs"], rec["io"]["outputs"], arrays)
    assert st["kind"] == "runs_right", st
    assert st["max_rel_err"] <= 1e-4


SYNTH_LIMIT = 400 << 20  # real-size params whose synth-bin is smaller get one (lower's tables)


def test_raw_codec_decoder_static_export_fixed_and_dynamized(tmp_path: Path) -> None:
    """pnnx aborts re-tracing the raw decoder at a second shape; its static trace at T=25
    fails to load (Slice 1=-233 of the codes' level axis). fix-slice makes it load; dynamize
    --pair with the T=50 trace (position tables from the weights) makes it run at T=13."""
    recs = {r["variant"]: r for r in MANIFEST["qwen3_tts"]["exports"]
            if r["module"] == "codec_decoder" and r["size"] == "tiny"}
    assert recs["raw"]["status"]["kind"] == "pnnx_failed"
    assert recs["raw_static"]["status"]["kind"] == "load_fails"
    assert (recs["raw_static"]["lengths"]["trace"], recs["raw_static_pair"]["lengths"]["trace"],
            recs["raw_static"]["lengths"]["reference"]) == (25, 50, 13)
    pnnx = QWEN / "tiny" / "codec_decoder.raw_static.pnnx.param"
    res = Dynamize(25, pair=static_codec("raw_static_pair"), pair_len=50, traced=pnnx,
                   pair_traced=QWEN / "tiny" / "codec_decoder.raw_static_pair.pnnx.param"
                   )(static_codec("raw_static"))
    check_golden("rawfix/codec_decoder.param", res.graph.dumps())
    assert res.format().count("position table") == 2
    out = tmp_path / "y.param"
    res.graph.save(out, tmp_path / "y.bin")
    arrays = dict(np.load(QWEN / "tiny" / "codec_decoder.raw_static.ref.npz"))
    io = recs["raw_static"]["io"]
    st = check(out, tmp_path / "y.bin", io["inputs"], io["outputs"], arrays)
    assert st["kind"] == "runs_right", st


# real size keeps no weights and no pnnx script: the folded length cannot be read
REFUSED = {"speaker_encoder": "frozen at the traced length"}


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
    g, _, failures = repair(param, param.with_suffix(".bin"))
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


@pytest.mark.parametrize("param", [p if p.name.split(".")[0] in FAST_REAL
                                   else pytest.param(p, marks=pytest.mark.slow)
                                   for p in RAW_REAL], ids=lambda p: p.name.split(".")[0])
def test_raw_real_params_repaired_load(param: Path, tmp_path: Path) -> None:
    """No weights are kept at real size: synth-bin's stand in where a repair writes weights
    (arange's position table) and the graph is small enough; otherwise the param alone."""
    bin_path = None
    g0 = paramsurgery.load(param)
    if synth_size(g0) < SYNTH_LIMIT:
        bin_path = tmp_path / "synth.bin"
        with open(bin_path, "wb") as fh:
            write_synth_bin(g0, fh)
    g, _, failures = repair(param, bin_path)
    module = param.name.split(".")[0]
    if module in REFUSED:
        assert len(failures) == 1 and REFUSED[module] in failures[0][1]
        return
    assert failures == []
    out = tmp_path / "y.param"
    out.write_text(g.dumps())
    assert check_loads(out)["kind"] == "loads"


def test_raw_codec_decoder_real_static_export_fixed_loads(tmp_path: Path) -> None:
    """Real size (no weights kept): fix-slice makes the static trace load; dynamizing it
    needs both exports' real weights (the position tables are compared value by value)."""
    real = QWEN / "real"
    assert check_loads(real / "codec_decoder.raw_static.ncnn.param")["kind"] == "load_fails"
    out = tmp_path / "y.param"
    out.write_text(static_codec("raw_static", real).dumps())
    assert check_loads(out)["kind"] == "loads"
