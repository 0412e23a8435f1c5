"""tools/peak_rss.py and tools/bench_memory.py (issue 15: memory of verification)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(),
                                reason="Linux /proc")


def test_peak_counts_the_whole_process_tree() -> None:
    """A parent holding 40 MB starts a child holding 60 MB while it still holds its own:
    the peak is the sum (RSS and PSS), not the parent's alone."""
    from peak_rss import measure

    child = "import time; b = bytearray(60 << 20); time.sleep(0.5)"
    parent = (f"import subprocess, sys; a = bytearray(40 << 20); "
              f"subprocess.run([sys.executable, '-c', {child!r}])")
    peak = measure([sys.executable, "-c", parent], interval=0.02)
    assert peak.returncode == 0
    assert peak.rss >= 100 << 20, peak
    assert 100 << 20 <= peak.pss <= peak.rss, peak


@pytest.mark.slow
def test_bench_memory_tiny_runs_every_check(tmp_path) -> None:
    """The whole table at tiny size (~1 min): every command runs and exits 0 (the ratios
    are meaningless at kilobytes of weights, so the tool's exit code is not asserted)."""
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, str(TOOLS / "bench_memory.py"), "--size", "tiny",
                        "--work", str(tmp_path / "work"), "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    import json

    rows = json.loads(out.read_text())
    assert [row["name"] for row in rows] == [
        "add-kvcache --verify", "verify-kvcache", "fold-gqa --verify",
        "fold-explicit-cache --verify", "fix --verify", "extract --verify", "compare", "reduce",
        "stream-check", "stream-check wide"], r.stdout
    assert all(row["returncode"] == 0 for row in rows), r.stdout
    assert all(row["peak_rss"] > 0 for row in rows), r.stdout
    assert "peak RSS GB" in r.stdout
