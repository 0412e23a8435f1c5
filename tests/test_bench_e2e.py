"""tools/bench_e2e.py: the timed Qwen3-TTS pipeline (tiny, ncnn fp32) checks what it times."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import bench_e2e  # noqa: E402

ROW = re.compile(r"^\| ncnn, 1 thread \| [\d.]+ ms \| [\d.]+ ms \| [\d.]+ ms \([\d.]+ / [\d.]+\) \| "
                 r"[\d.]+ \| [\d.]+ \| [\d.]+ ms \| \d+ MB \| [\d.]+-[\d.]+ \|$")


def test_table_for_one_thread(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench_e2e.main(["--frames", "4", "--repeat", "1", "--threads", "1", "--no-torch"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, lines
    assert ROW.match(lines[2]), lines[2]
    assert lines[-2] == "torch rows not run: --no-torch"
    assert "codes 4/4 identical to torch" in lines[-1]


@pytest.mark.slow
def test_torch_rows_and_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    if importlib.util.find_spec("qwen_tts") is None:    # importing it needs the torchaudio stub
        pytest.skip("qwen-tts is not installed in this Python")
    rc = bench_e2e.main(["--frames", "4", "--repeat", "1", "--threads", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, lines
    assert lines[2].startswith("| torch, 1 thread | ") and ROW.match(lines[3]), lines
    assert re.match(r"^torch / ncnn at 1 thread\(s\): whole run [\d.]+x", lines[4]), lines[4]


def test_a_run_with_other_codes_is_counted(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with np.load(bench_e2e.REFERENCE) as data:
        ref = {k: data[k] for k in data.files}
    ref["output_codes"] = ref["output_codes"].copy()
    ref["output_codes"][1, 3] = (ref["output_codes"][1, 3] + 1) % 32
    path = tmp_path / "e2e.ref.npz"
    np.savez(path, **ref)
    monkeypatch.setattr(bench_e2e, "REFERENCE", path)
    row = bench_e2e.run_child(1, 3, 1)
    assert row["codes_identical"] == 2     # main refuses to print figures for such a run
