"""Progress and streaming: a plan line at once, a line per finished step, a bar on a
terminal only, and after SIGTERM what was finished (issue 25, item 4)."""

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from paramsurgery.core import progress

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
from pty_latency import PtyRun as _PtyRun  # noqa: E402


def PtyRun(*args, cwd):
    """`paramsurgery ARGS...` of this checkout under two pseudo-terminals."""
    return _PtyRun("paramsurgery", *args, cwd=cwd, repo=REPO)


TALKER = REPO / "fixtures/qwen3_tts/tiny/talker_decoder.ported.ncnn"  # largest bundled decoder


def _startup(cwd) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "paramsurgery", "--version"], capture_output=True,
                   cwd=cwd, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True)
    return time.monotonic() - t0


def test_add_kvcache_verify_streams_under_a_pty(tmp_path):
    out = tmp_path / "kv.param"
    run = PtyRun("add-kvcache", f"{TALKER}.param", "--bin", f"{TALKER}.bin", "-o", out,
                 "--verify", "--m", "6", cwd=tmp_path)
    assert run.finish() == 0, run.err.decode()
    # the plan line, on stderr (stdout keeps the report), comes as soon as the command
    # starts (the interpreter's own start is the floor on a loaded machine)
    first_at, first = run.err_lines[0]
    assert first.startswith("add-kvcache: ") and "proving the result through ncnn" in first
    assert first_at < max(1.0, _startup(tmp_path) + 0.5), (first_at, run.lines)
    texts = [t for _, t in run.lines]
    assert texts[0].startswith("kv-cache parity: prefill 8 + 6 single-token steps")
    steps = [t for t in texts if t.strip().startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1", "2", "3", "4", "5", "6"]
    # each step's line once (not again in the final report), the verdict once
    assert texts.count("  parity: ok") == 1 and len(set(steps)) == len(steps) == 6
    assert texts.index("  parity: ok") > texts.index(steps[-1])
    assert texts[-1].startswith("wrote ")
    # stderr is a terminal: the bar was drawn there (and erased: leave=False)
    assert b"kv-cache parity" in run.err and b"run/s" in run.err and b"\r" in run.err
    assert out.exists()


def test_quiet_and_json_draw_no_bar(tmp_path):
    kv = tmp_path / "kv.param"
    assert subprocess.run([sys.executable, "-m", "paramsurgery", "add-kvcache",
                           f"{TALKER}.param", "-o", kv], cwd=tmp_path, capture_output=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO))).returncode == 0
    for extra in (["--quiet"], ["--format", "json"]):
        run = PtyRun("verify-kvcache", kv, f"{TALKER}.bin", "--m", "2", *extra, cwd=tmp_path)
        assert run.finish() == 0, run.err.decode()
        assert b"kv-cache parity" not in run.err and b"\r" not in run.err, run.err
        if extra == ["--quiet"]:  # no progress; the report still has every step, once
            steps = [t for _, t in run.lines if t.strip().startswith("step ")]
            assert [s.split()[1] for s in steps] == ["1", "2"]
        else:
            import json

            data = json.loads("\n".join(t for _, t in run.lines))
            step = data["steps"][1]
            assert (step["label"], step["first"], step["last"]) == ("step 1", 8, 8)


def test_sigterm_shows_what_was_finished(tmp_path):
    out = tmp_path / "kv.param"
    m = 400
    run = PtyRun("add-kvcache", f"{TALKER}.param", "--bin", f"{TALKER}.bin", "-o", out,
                 "--verify", "--m", m, cwd=tmp_path)
    run.pump(until=lambda lines: any(t.strip().startswith("step 2 ") for _, t in lines))
    run.proc.send_signal(signal.SIGTERM)
    rc = run.finish()
    assert rc == 128 + signal.SIGTERM
    texts = [t for _, t in run.lines]
    done = [t for t in texts if t.strip().startswith("step ")]
    assert 2 <= len(done) < m  # the finished steps were shown, the rest never ran
    err = run.err.decode().replace("\r", "")
    assert "terminated (signal 15); finished: kv-cache parity: " in err
    finished = int(err.split("finished: kv-cache parity: ")[1].split(" of ")[0])
    assert finished >= len(done) + 2  # full prefill + prefill + the steps shown
    assert f" of {m + 3} run(s) finished" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_reporter_console_lines_and_unshown():
    buf = io.StringIO()
    rep = progress.ConsoleReporter(buf)
    with progress.using(rep):
        progress.plan("plan: 2 steps")
        with progress.task("work", total=2) as t:
            t.done("  a ok")
            t.done("  b ok")
        assert progress.unshown("header\n  a ok\n  b ok\n  verdict") == "header\n  verdict"
    assert buf.getvalue() == "plan: 2 steps\n  a ok\n  b ok\n"
    assert rep.interrupted() == ["work: 2 of 2 step(s) finished"]
    # the library default prints nothing
    silent = progress.current()
    assert not isinstance(silent, progress.ConsoleReporter)
    assert progress.unshown("x\ny") == "x\ny"


@pytest.mark.slow
def test_add_kvcache_verify_streams_on_the_real_size_talker(tmp_path):
    """The real-size talker decoder (28 blocks) with synth-bin weights."""
    real = REPO / "fixtures/qwen3_tts/real/talker_decoder.ported.ncnn.param"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    b = tmp_path / "t.bin"
    subprocess.run([sys.executable, "-m", "paramsurgery", "synth-bin", real, "-o", b],
                   check=True, env=env, capture_output=True)
    run = PtyRun("add-kvcache", real, "--bin", b, "-o", tmp_path / "kv.param", "--verify",
                 "--n", "4", "--m", "3", cwd=tmp_path)
    assert run.finish(timeout=3000) == 0, run.err.decode()
    first_at = run.err_lines[0][0]
    assert first_at < max(1.0, _startup(tmp_path) + 0.5), (first_at, run.lines)
    steps = [(at, t) for at, t in run.lines if t.strip().startswith("step ")]
    assert len(steps) == 3 and steps[0][0] > first_at


def test_verify_at_lengths_streams_a_line_per_length():
    """Generic verification (fold-gqa/rewrite --verify): the plan, then each length."""
    from paramsurgery.verify.equivalence import verify_equivalent

    g = REPO / "fixtures/rewrite/gelu_tanh.param"
    buf = io.StringIO()
    with progress.using(progress.ConsoleReporter(buf)):
        check = verify_equivalent(g, g, inputshape={"in0": ("T", 16)})
    assert check.ok
    lines = buf.getvalue().splitlines()
    assert lines[0] == f"parity through ncnn against {g}: 2 run(s) (T=7, T=13)"
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == ["T=7", "T=13"]
    assert all(ln.endswith("(ok)") and "max rel 0.00e+00 over out0" in ln for ln in lines[1:])
