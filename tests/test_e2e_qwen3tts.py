"""tools/e2e_qwen3tts.py: the whole Qwen3-TTS pipeline on ncnn against the HF reference
(fixtures/qwen3_tts/tiny/e2e.ref.npz; no torch needed)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import e2e_qwen3tts  # noqa: E402

REAL_LAST = re.compile(r"^e2e real: codes (\d+)/(\d+) frames identical(?: until (.*))?; logits rel "
                       r"(\S+) over (\d+) choices; waveform rel (\S+) on the (\d+) matching "
                       r"frames; chunked == offline rel (\S+)$")
LAST = re.compile(r"^e2e: codes (\d+)/(\d+) frames identical; waveform rel (\S+); "
                  r"chunked == offline rel (\S+)$")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    rc = e2e_qwen3tts.main(list(args))
    out = capsys.readouterr()
    return rc, out.out.strip().splitlines(), out.err


def test_tiny_pipeline_matches_torch(capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines, _ = _run(capsys, "--frames", "24", "--threads", "1")
    m = LAST.match(lines[-1])
    assert m, lines[-1]
    assert (int(m[1]), int(m[2])) == (24, 24)
    assert float(m[3]) <= 1e-4 and float(m[4]) <= 1e-4
    assert rc == 0
    log = "\n".join(lines)
    # the passes really ran: kv caches, both codebook fusions, the streaming conv stack
    assert "add-kvcache: 2 SDPA layer(s)" in log
    assert log.count("fuse-codebooks: 1 fusion(s), 15 tables") == 2
    assert re.search(r"add-conv-cache: \d+ state blob", log)


def test_a_wrong_reference_code_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with np.load(e2e_qwen3tts.REFERENCE) as data:
        ref = {k: data[k] for k in data.files}
    ref["output_codes"] = ref["output_codes"].copy()
    ref["output_codes"][2, 5] = (ref["output_codes"][2, 5] + 1) % 32
    path = tmp_path / "e2e.ref.npz"
    np.savez(path, **ref)
    monkeypatch.setattr(e2e_qwen3tts, "REFERENCE", path)
    rc, lines, _ = _run(capsys, "--frames", "3", "--threads", "1")
    assert rc == 1
    assert lines[-1].startswith("e2e: codes 2/3 frames identical")
    assert any(line.startswith("frame 2: ncnn ") for line in lines)


def test_frames_beyond_the_reference_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, "--frames", "25", "--threads", "1")
    assert rc == 2 and "the reference has 24 frames" in err


@pytest.mark.slow
def test_raw_variant_runs_or_names_the_modules(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --raw-fallback: runs, or stops (exit 2) naming each module `fix` leaves
    unloadable (today speaker_encoder, with the layer types left)."""
    rc, lines, err = _run(capsys, "--variant", "raw", "--frames", "4", "--threads", "1")
    if rc == 2:
        assert err.startswith("e2e: --variant raw cannot run: ")
        assert re.search(r"^  \w+: ncnn cannot load it after paramsurgery fix .*; left: ", err,
                         re.MULTILINE), err
    else:
        assert rc == 0 and LAST.match(lines[-1])


@pytest.mark.slow
@pytest.mark.skipif(shutil.disk_usage("/tmp").free < 12e9, reason="needs ~9 GB of scratch")
def test_real_size_synth_runs(capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines, _ = _run(capsys, "--size", "real", "--synth", "--frames", "2")
    assert rc == 0
    assert lines[-1].startswith("e2e real (synth weights, no reference): 2 frames, 7680 samples")


@pytest.mark.slow
def test_raw_modules_that_load_run_right_in_the_pipeline(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """Every raw module through `paramsurgery fix` alone (the codec decoder's one static
    trace dynamized by fix, the speaker encoder's length mask thawed): no fallback needed."""
    rc, lines, _ = _run(capsys, "--variant", "raw", "--raw-fallback", "--frames", "24",
                        "--threads", "1")
    m = LAST.match(lines[-1])
    assert m and (int(m[1]), int(m[2])) == (24, 24), lines[-1]
    assert float(m[3]) <= 1e-4 and float(m[4]) <= 1e-4
    assert rc == 0
    log = "\n".join(lines)
    raw_parts = {line.split("(")[0].strip() for line in lines
                 if ".raw): " in line and ": loads in ncnn" in line}
    assert len(raw_parts) == 9, log
    assert "codec (codec_decoder.raw): static export, paramsurgery fix (fix-slice + dynamize " \
           "from one trace): loads in ncnn" in log
    fallback = next(line for line in lines if line.startswith("raw: "))
    assert fallback == "raw: 9 module(s) after `paramsurgery fix` alone", fallback


@pytest.mark.slow
def test_regenerating_the_reference_is_byte_identical(tmp_path: Path) -> None:
    import importlib.util
    import subprocess

    for dist in ("torch", "qwen_tts", "transformers"):
        if importlib.util.find_spec(dist) is None:
            pytest.skip(f"{dist} is not installed (export environment needed)")
    out = tmp_path / "fixtures"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_fixtures.py"), "--size",
                           "tiny", "--only", "e2e", "--out", str(out)], capture_output=True,
                          text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = out / "qwen3_tts" / "tiny" / "e2e.ref.npz"
    assert new.read_bytes() == e2e_qwen3tts.REFERENCE.read_bytes()


@pytest.mark.slow
@pytest.mark.skipif(shutil.disk_usage("/tmp").free < 12e9, reason="needs ~5 GB of scratch")
def test_real_size_matches_torch_up_to_a_near_tie(capsys: pytest.CaptureFixture[str]) -> None:
    """Real size, the same seeded weights on both sides (exported .bin files in a work dir,
    reused by the next run: ~8 min and 6.7 GB peak RSS the first time), 4 frames: codes equal
    torch's until a named near tie (or all frames), logits and waveform within fp32 noise."""
    import importlib.util
    import os

    for dist in ("torch", "qwen_tts", "transformers", "pnnx"):
        if importlib.util.find_spec(dist) is None:
            pytest.skip(f"{dist} is not installed (export environment needed)")
    work = os.environ.get("PARAMSURGERY_E2E_REAL_WORK", str(e2e_qwen3tts.REAL_WORK))
    rc, lines, _ = _run(capsys, "--size", "real", "--frames", "4", "--work", work)
    m = REAL_LAST.match(lines[-1])
    assert m, lines[-1]
    matching, frames = int(m[1]), int(m[2])
    assert frames == 4 and (matching == 4 or "near tie" in (m[3] or "")), lines[-1]
    assert float(m[4]) <= 1e-4 and int(m[5]) >= 16 * matching
    assert float(m[6]) <= 1e-4 and float(m[8]) <= 1e-4
    assert rc == 0
    log = "\n".join(lines)
    # every net from the generator's own export, its graph the committed fixture's
    assert len(re.findall(r"^\s*export \S+: (\.param == fixtures/|reused )", log, re.M)) == 10
    assert "add-kvcache: 28 SDPA layer(s)" in log and "add-kvcache: 5 SDPA layer(s)" in log
    assert "window cache 71 rows x 8 SDPA" in log


def test_a_stale_fixture_param_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """The export's .param differs from the committed fixture: refused, naming both files,
    instead of pairing the fixture graph with weights of another graph."""
    import json
    from types import SimpleNamespace

    from paramsurgery.repro import pnnx_export
    from qwen3tts import real_export

    manifest = json.loads((REPO / "fixtures" / "manifest.json").read_text())
    other = tmp_path / "x.ncnn.param"
    other.write_text("7767517\n0 0\n")
    fake_bin = tmp_path / "x.ncnn.bin"
    fake_bin.write_bytes(b"")
    monkeypatch.setattr(real_export, "_spec", lambda m, v: SimpleNamespace(
        wrapper=None, trace_inputs=(), trace_inputs2=None))
    monkeypatch.setattr(pnnx_export, "export_with_pnnx", lambda *a, **k: SimpleNamespace(
        ok=True, ncnn_param=other, ncnn_bin=fake_bin, returncode=0, signal=None, stderr=""))
    with pytest.raises(real_export.StaleFixture,
                       match=r"talker_text_embed\.ported: the generator's export .* differs "
                             r"from the fixture fixtures/qwen3_tts/real/talker_text_embed"):
        real_export.export(tmp_path / "work", manifest, [])
    assert not (tmp_path / "work" / "talker_text_embed.ported.ncnn.bin").exists()
