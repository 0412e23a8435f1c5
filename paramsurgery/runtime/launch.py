"""The one way this package starts a Python child process (ncnn runs, shape oracles, torch
exports, weight-read recorders): `run_child` for a run that ends (timeout, crash and exit
status told apart, never raised), `start_child` for one that streams (frames, a loader
that serves many files). Both give the child `child_env()`. External tools (the `pnnx`
binary, a user's check command) are not Python children and are run where they are used.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping, Sequence


def child_env() -> dict[str, str]:
    """Environment for a child `python -m paramsurgery...`: this package stays importable
    even when it is used from a source tree that is not installed."""
    env = dict(os.environ)
    # glibc raises its mmap threshold each time a large block is freed, so after ncnn packs
    # and frees the first weight matrices the later ones come from the heap and their freed
    # originals stay resident (~15% of the weight bytes on a 0.4B decoder). A fixed
    # threshold keeps every large block in its own mapping, returned on free.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))
    root = str(Path(__file__).resolve().parent.parent.parent)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env["PYTHONPATH"] = os.pathsep.join([root] + parts)
    return env


@dataclass
class ChildRun:
    """How a child ended: `returncode` None when it was stopped at its timeout."""

    returncode: int | None
    stdout: Any
    stderr: Any
    timeout: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def how(self) -> str:
        """`timeout after N s`, `signal 11 (SIGSEGV)` or `exit N`."""
        if self.returncode is None:
            return f"timeout after {self.timeout:.0f} s"
        if self.signal is not None:
            try:
                return f"signal {self.signal} ({signal.Signals(self.signal).name})"
            except ValueError:
                return f"signal {self.signal}"
        return f"exit {self.returncode}"

    def tail(self, n: int = 3, sep: str = " ") -> str:
        """The last `n` non-empty lines of its stderr."""
        text = self.stderr.decode("utf-8", "replace") if isinstance(self.stderr, bytes) else \
            (self.stderr or "")
        return sep.join([ln for ln in text.strip().splitlines() if ln.strip()][-n:])


def python_argv(*args: str | os.PathLike) -> list[str]:
    """`python ARGS...` with this interpreter."""
    return [sys.executable, *(os.fspath(a) for a in args)]


def run_child(*args: str | os.PathLike, timeout: float, input: Any = None, text: bool = True,
              errors: str | None = None, env: Mapping[str, str] | None = None) -> ChildRun:
    """Run `python ARGS...` to its end (or its timeout, when it is killed)."""
    try:
        proc = subprocess.run(python_argv(*args), input=input, capture_output=True, text=text,
                              errors=errors, timeout=timeout,
                              env=dict(env) if env is not None else child_env())
    except subprocess.TimeoutExpired as exc:
        return ChildRun(None, exc.stdout, exc.stderr, timeout)
    return ChildRun(proc.returncode, proc.stdout, proc.stderr, timeout)


def start_child(*args: str | os.PathLike, stdin: int | IO | None = None,
                stdout: int | IO | None = None, stderr: int | IO | None = None,
                env: Mapping[str, str] | None = None, bufsize: int = -1) -> subprocess.Popen:
    """Start `python ARGS...` and hand back the process (the caller reads and waits)."""
    return subprocess.Popen(python_argv(*args), stdin=stdin, stdout=stdout, stderr=stderr,
                            env=dict(env) if env is not None else child_env(), bufsize=bufsize)


def module_argv(module: str, *args: str | os.PathLike) -> Sequence[str]:
    """`-m module ARGS...` for `run_child` / `start_child`."""
    return ["-m", module, *(os.fspath(a) for a in args)]


def stream_child(*args: str | os.PathLike, timeout: float, on_line: Any,
                 env: Mapping[str, str] | None = None) -> ChildRun:
    """Run `python ARGS...` to its end (or its timeout), handing each line the child
    prints on stdout to `on_line(text)` as it comes (a child reporting finished steps).
    The child is killed when the caller is interrupted (SIGINT, SIGTERM as `Terminated`).
    `stdout` of the result is what the child printed, `stderr` its error output."""
    import selectors
    import tempfile
    import time

    deadline = time.monotonic() + timeout
    lines: list[str] = []
    with tempfile.TemporaryFile() as err:
        proc = start_child(*args, stdout=subprocess.PIPE, stderr=err, env=env, bufsize=0)
        assert proc.stdout is not None
        try:
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            pending = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    proc.kill()
                    proc.wait()
                    err.seek(0)
                    return ChildRun(None, "".join(lines), err.read().decode("utf-8", "replace"),
                                    timeout)
                if not sel.select(min(left, 1.0)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                pending += chunk
                while b"\n" in pending:
                    raw, pending = pending.split(b"\n", 1)
                    text = raw.decode("utf-8", "replace")
                    lines.append(text + "\n")
                    on_line(text)
            if pending:
                lines.append(pending.decode("utf-8", "replace"))
                on_line(pending.decode("utf-8", "replace"))
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            err.seek(0)
            return ChildRun(None, "".join(lines), err.read().decode("utf-8", "replace"), timeout)
        finally:
            if proc.poll() is None:  # interrupted (or on_line raised): the child goes too
                proc.kill()
                proc.wait()
            proc.stdout.close()
        err.seek(0)
        return ChildRun(proc.returncode, "".join(lines), err.read().decode("utf-8", "replace"),
                        timeout)
