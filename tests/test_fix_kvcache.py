"""`paramsurgery fix --kvcache`: fix, then add-kvcache --verify on its result, each step's
report in turn (issue 24, the one-shot path). On a zoo static export (traced at 7, the
torch reference at 11 next to it) the cached graph is proven through ncnn (prefill 8 + 4
steps) and its greedy decode equals HF's own cached decode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.verify.decode import greedy_decode

ZOO = Path(__file__).resolve().parents[1] / "fixtures" / "zoo"


def _copy(family: str, route: str, tmp_path: Path) -> Path:
    entry = json.loads((ZOO / "zoo.json").read_text())["families"][family]["routes"][route]
    for rel in entry["files"]:
        shutil.copy(ZOO / rel, tmp_path / Path(rel).name)
    return tmp_path / f"{route}.ncnn.param"


def test_fix_kvcache_gives_hf_cached_decode(tmp_path, capsys):
    param = _copy("qwen3", "embeds_sdpa_static", tmp_path)
    out = tmp_path / "f.param"
    assert main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o", str(out),
                 "--kvcache"]) == 0
    text = capsys.readouterr().out
    # each step visible: fix's verify, the add-kvcache command, its parity run, its writes
    for line in ("embeds_sdpa_static.ref.npz: ok", "kvcache: add-kvcache",
                 "parity: ok", "wrote " + str(tmp_path / "f.kvcache.param")):
        assert line in text, line
    cached = tmp_path / "f.kvcache.param"
    assert all(s.params.get(7) == 1 for s in paramsurgery.load(cached).by_type("SDPA"))
    torch = np.load(ZOO / "qwen3" / "torch.npz")
    want = torch["decode.tokens"].tolist()
    got = greedy_decode(cached, cached.with_suffix(".bin"), embed=torch["decode.embed_tokens"],
                        prompt=torch["decode.prompt_ids"][0].tolist(), steps=len(want))
    assert got.error is None, got.error
    assert got.tokens == want
    logits = torch["decode.logits"][:len(got.logits)]
    assert float(np.abs(got.logits - logits).max() / np.abs(logits).max()) < 1e-4


def test_fix_kvcache_needs_the_weights(tmp_path, capsys):
    param = _copy("qwen3", "embeds_sdpa_static", tmp_path)
    assert main(["fix", str(param), "-o", str(tmp_path / "f.param"), "--kvcache"]) == 2
    assert "--kvcache proves the cache through ncnn: give the weights (--bin)" in \
        capsys.readouterr().err
    assert not (tmp_path / "f.param").exists()


def test_fix_kvcache_without_symbolic_shapes_names_the_command(tmp_path, capsys):
    """The kv form (a dynamic export: no static trace dynamized) has no derived input shapes
    to prove the cache with: refused after fix, naming the add-kvcache command to run."""
    param = _copy("llama", "kv_sdpa_dynamic", tmp_path)
    out = tmp_path / "f.param"
    code = main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o", str(out),
                 "--kvcache"])
    err = capsys.readouterr().err
    assert code == 2 and f"run add-kvcache {out} --bin" in err, err
    assert not (tmp_path / "f.kvcache.param").exists()


@pytest.mark.parametrize("extra", [["--format", "json"], ["-o", "-"]])
def test_fix_kvcache_refuses_one_stream_outputs(tmp_path, capsys, extra):
    param = _copy("qwen3", "embeds_sdpa_static", tmp_path)
    args = ["fix", str(param), "--bin", str(param.with_suffix(".bin")), "--kvcache", *extra]
    if "-o" not in extra:
        args += ["-o", str(tmp_path / "f.param")]
    assert main(args) == 2
    assert "--kvcache writes two files" in capsys.readouterr().err
