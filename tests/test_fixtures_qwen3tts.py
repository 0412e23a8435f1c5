"""The committed Qwen3-TTS fixtures (fixtures/qwen3_tts) against fixtures/manifest.json
and against what ncnn does with them today.

Runs without torch: numpy, ncnn and the manifest only. Every ncnn run goes through
`paramsurgery.runtime.child.run_isolated`, so a graph that crashes ncnn fails one test instead
of the session. The slow test (regenerating the tiny set) needs the export environment.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramsurgery.runtime.child import NO_BATCH, Feed, Fetch, RunOptions, run_isolated
from paramsurgery.formats.param_text import dumps

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
MANIFEST_PATH = FIXTURES / "manifest.json"
QWEN_PREFIX = "qwen3_tts/"
REL_TOL = 1e-4

MODULES = ("talker_text_embed", "talker_codec_embed", "talker_decoder", "talker_codec_head",
           "predictor_decoder", "predictor_embeds", "predictor_heads", "codec_decoder",
           "speaker_encoder", "mimi_encoder")


def _manifest() -> dict[str, Any]:
    return json.loads(MANIFEST_PATH.read_text())


MANIFEST = _manifest()
EXPORTS: list[dict[str, Any]] = MANIFEST["qwen3_tts"]["exports"]


def _exports(size: str, pred) -> list[dict[str, Any]]:  # noqa: ANN001
    return [r for r in EXPORTS if r["size"] == size and pred(r)]


def _id(rec: dict[str, Any]) -> str:
    return f"{rec['size']}:{rec['module']}.{rec['variant']}"


TINY_PORTED = _exports("tiny", lambda r: r["variant"] == "ported")
TINY_OTHER = _exports("tiny", lambda r: r["variant"] != "ported")
REAL_WITH_PARAM = _exports("real", lambda r: "ncnn_param" in r.get("files", {}))
NCNN_PARAMS = sorted(e["path"] for e in MANIFEST["files"]
                     if e["path"].startswith(QWEN_PREFIX) and e["kind"] == "ncnn_param")


# --------------------------------------------------------------------------- manifest

def test_manifest_hashes_and_sizes_match_files() -> None:
    for entry in MANIFEST["files"]:
        if "sha256" not in entry:
            continue
        path = FIXTURES / entry["path"]
        assert path.is_file(), entry["path"]
        data = path.read_bytes()
        assert len(data) == entry.get("bytes", entry.get("size")), entry["path"]
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["path"]


def test_every_listed_file_exists_and_every_file_is_listed() -> None:
    listed = {e["path"] for e in MANIFEST["files"] if e["path"].startswith(QWEN_PREFIX)}
    on_disk = {p.relative_to(FIXTURES).as_posix() for p in (FIXTURES / "qwen3_tts").rglob("*")
               if p.is_file() and p.name != "README.md"}
    assert listed == on_disk


def test_export_records_point_at_listed_files() -> None:
    listed = {e["path"] for e in MANIFEST["files"]}
    for rec in EXPORTS:
        for rel in rec.get("files", {}).values():
            assert rel in listed, (_id(rec), rel)
        if rec["status"]["kind"] in ("pnnx_failed", "trace_failed"):
            assert not rec.get("files"), _id(rec)


def test_all_modules_and_variants_are_present() -> None:
    for size in ("tiny", "real"):
        have = {(r["module"], r["variant"]) for r in EXPORTS if r["size"] == size}
        for module in MODULES:
            assert (module, "ported") in have, (size, module)
            assert (module, "raw") in have, (size, module)
        assert ("predictor_embeds", "unfused") in have, size


def test_tiny_ported_files_and_real_param_only() -> None:
    for rec in EXPORTS:
        files = rec.get("files", {})
        if rec["size"] == "real":
            assert "ncnn_bin" not in files and "reference" not in files, _id(rec)
        elif rec["variant"] == "ported":
            assert {"ncnn_param", "ncnn_bin", "pnnx_param", "reference"} <= set(files), _id(rec)
        if rec["status"]["kind"] not in ("pnnx_failed", "trace_failed"):
            assert {"ncnn_param", "pnnx_param"} <= set(files), _id(rec)


def test_every_export_used_two_trace_shapes_and_an_untraced_length() -> None:
    for rec in EXPORTS:
        lengths = rec["lengths"]
        if lengths["trace2"] is None:  # the one static export (codec_decoder.raw_static)
            assert "static_note" in rec["notes"] and "inputshape2=" not in rec["pnnx"]["command"]
            assert lengths["reference"] != lengths["trace"], _id(rec)
            continue
        assert lengths["trace"] != lengths["trace2"], _id(rec)
        assert lengths["reference"] not in (lengths["trace"], lengths["trace2"]), _id(rec)
        if "pnnx" in rec:
            assert "inputshape2=" in rec["pnnx"]["command"] and "fp16=0" in rec["pnnx"]["command"]


def test_committed_size_budget() -> None:
    total = sum(p.stat().st_size for p in (FIXTURES / "qwen3_tts").rglob("*") if p.is_file())
    assert total < 22 * 1024 * 1024, total


# --------------------------------------------------------------------------- ncnn runs

def _run(rec: dict[str, Any]) -> tuple[Any, dict[str, np.ndarray]]:
    files = rec["files"]
    with np.load(FIXTURES / files["reference"]) as data:
        arrays = {k: data[k] for k in data.files}
    feeds = {i["blob"]: Feed(arrays[i["key"]], int(i.get("batch_index", NO_BATCH)))
             for i in rec["io"]["inputs"]}
    fetches = [Fetch(o["blob"], int(o.get("batch_index", NO_BATCH))) for o in rec["io"]["outputs"]]
    res = run_isolated(FIXTURES / files["ncnn_param"], FIXTURES / files["ncnn_bin"], feeds,
                       fetches, RunOptions(), timeout=300)
    return res, arrays


def _max_rel_err(res: Any, rec: dict[str, Any], arrays: dict[str, np.ndarray]) -> float | None:
    """max over outputs of max|ncnn - torch| / max|torch|; None if a size differs."""
    worst = 0.0
    for o in rec["io"]["outputs"]:
        got = np.asarray(res.outputs[o["blob"]], dtype=np.float64)
        ref = np.asarray(arrays[o["key"]], dtype=np.float64)
        if got.size != ref.size:
            return None
        diff = float(np.abs(got.reshape(ref.shape) - ref).max())
        worst = max(worst, diff / float(np.abs(ref).max()) if np.abs(ref).max() > 0 else diff)
    return worst


def _observed_kind(res: Any, rec: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    if res.status == "crash":
        return "crashes"
    if res.status in ("load_param_failed", "load_model_failed"):
        return "load_fails"
    if res.status != "ok":
        return "run_fails"
    err = _max_rel_err(res, rec, arrays)
    return "runs_right" if err is not None and err <= REL_TOL else "wrong"


@pytest.mark.parametrize("rec", TINY_PORTED, ids=_id)
def test_tiny_ported_runs_in_ncnn_and_matches_torch(rec: dict[str, Any]) -> None:
    assert rec["status"]["kind"] == "runs_right", rec["status"]
    res, arrays = _run(rec)
    assert res.ok, res.describe()
    err = _max_rel_err(res, rec, arrays)
    assert err is not None, "output size differs from the torch reference"
    assert err <= REL_TOL, err


@pytest.mark.parametrize("rec", TINY_OTHER, ids=_id)
def test_tiny_raw_status_is_what_ncnn_does_today(rec: dict[str, Any]) -> None:
    recorded = rec["status"]["kind"]
    if recorded in ("pnnx_failed", "trace_failed"):
        assert rec["status"].get("stderr_tail") or rec["status"].get("detail")
        pytest.skip(f"no ncnn files: {recorded}")
    res, arrays = _run(rec)
    assert _observed_kind(res, rec, arrays) == recorded, res.describe()


_LOAD_PARAM_ONLY = (
    "import sys, ncnn\n"
    "net = ncnn.Net()\n"
    "sys.exit(0 if net.load_param(sys.argv[1]) == 0 else 3)\n")


@pytest.mark.parametrize("rec", REAL_WITH_PARAM, ids=_id)
def test_real_param_load_status_is_what_ncnn_does_today(rec: dict[str, Any]) -> None:
    """Real-size `.bin` files are not committed (the full run status in the manifest was
    measured at generation time with the real `.bin`). Here: `load_param` alone, in a child
    process (loading empty weights would allocate the real ~GB tensors), must succeed
    exactly when the recorded status is not `load_fails`."""
    proc = subprocess.run([sys.executable, "-c", _LOAD_PARAM_ONLY,
                           str(FIXTURES / rec["files"]["ncnn_param"])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 3), proc.stderr[-2000:]
    loads = proc.returncode == 0
    assert loads == (rec["status"]["kind"] != "load_fails"), (proc.stderr[-500:], rec["status"])


def test_kvcache_references_follow_the_documented_convention() -> None:
    kv = MANIFEST["qwen3_tts"]["kvcache"]
    assert {k["module"] for k in kv} == {"talker_decoder", "predictor_decoder"}
    for entry in kv:
        conv = entry["convention"]
        with np.load(FIXTURES / entry["path"]) as data:
            past = 0
            for name in ["prefill"] + [f"step{i + 1}" for i in range(conv["steps"])]:
                lq = conv["prefill_length"] if name == "prefill" else 1
                assert data[f"{name}_embeds"].shape == (1, lq, conv["hidden_size"])
                assert data[f"{name}_mask"].shape == (lq, past + lq)
                assert data[f"{name}_cos"].shape == (1, lq, conv["rope"]["head_dim"])
                assert data[f"{name}_out"].shape == (1, lq, conv["hidden_size"])
                past += lq
            full = data["full_out"]
            outs = np.concatenate([data["prefill_out"]] + [data[f"step{i + 1}_out"]
                                                          for i in range(conv["steps"])], axis=1)
            assert np.abs(outs - full).max() <= 1e-5


# --------------------------------------------------------------------------- round trip

@pytest.mark.parametrize("rel", NCNN_PARAMS)
def test_param_round_trips_byte_identical(rel: str) -> None:
    import paramsurgery

    text = (FIXTURES / rel).read_text()
    assert dumps(paramsurgery.loads(text)) == text


# --------------------------------------------------------------------------- regeneration

@pytest.mark.slow
def test_regenerating_the_tiny_set_gives_identical_params(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # find_spec, not import: importing qwen_tts needs the generator's torchaudio stub
    for dist in ("qwen_tts", "transformers", "pnnx"):
        if importlib.util.find_spec(dist) is None:
            pytest.skip(f"{dist} is not installed (export environment needed)")
    out = tmp_path / "fixtures"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "make_fixtures.py"), "--size",
                           "tiny", "--out", str(out), "--scratch", str(tmp_path / "scratch"),
                           "--only", *MODULES], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    committed = sorted((FIXTURES / "qwen3_tts" / "tiny").glob("*.param"))
    assert committed
    for path in committed:
        new = out / "qwen3_tts" / "tiny" / path.name
        assert new.is_file(), path.name
        assert new.read_bytes() == path.read_bytes(), path.name
