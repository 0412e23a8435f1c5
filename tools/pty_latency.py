"""Run a command under pseudo-terminals and print when each of its lines arrived.

    python tools/pty_latency.py -- paramsurgery add-kvcache talker.param --bin talker.bin \
        -o kv.param --verify

stdout and stderr are two terminals (100 columns), as in an interactive shell, so progress
bars draw and stdout is a tty; each stdout line is printed with the seconds since the start,
then the first stderr line and the exit code. `--term-after LINE` sends SIGTERM once a
stdout line starts with LINE (what a command shows after SIGTERM). tests/test_progress.py
runs commands through `PtyRun`.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time


class PtyRun:
    """A command with stdout and stderr on two pseudo-terminals; each line with the time
    it arrived (seconds after the start)."""

    def __init__(self, *args, cwd=None, repo=None):
        self.out_m, out_s = pty.openpty()
        self.err_m, err_s = pty.openpty()
        for fd in (out_s, err_s):  # a terminal 100 columns wide (a new pty has 0 x 0)
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        env = dict(os.environ, COLUMNS="100")
        if repo is not None:
            env["PYTHONPATH"] = str(repo)
        self.t0 = time.monotonic()
        argv = [str(a) for a in args]
        if argv and argv[0] == "paramsurgery":
            argv = [sys.executable, "-m", "paramsurgery", *argv[1:]]
        self.proc = subprocess.Popen(argv,
                                     stdout=out_s, stderr=err_s, stdin=subprocess.DEVNULL,
                                     cwd=cwd, env=env)
        os.close(out_s)
        os.close(err_s)
        self.lines: list[tuple[float, str]] = []
        self.err = b""
        self.err_lines: list[tuple[float, str]] = []
        self._pending = b""

    def pump(self, until=None, timeout=120.0) -> None:
        """Read until `until(lines)` holds, or the process ends and its output is drained."""
        deadline = time.monotonic() + timeout
        fds = [self.out_m, self.err_m]
        while fds and time.monotonic() < deadline:
            if until is not None and until(self.lines):
                return
            ready, _, _ = select.select(fds, [], [], 0.2)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the other side is closed
                    data = b""
                if not data:
                    fds.remove(fd)
                elif fd == self.err_m:
                    self.err += data
                    if not self.err_lines and b"\n" in self.err:  # the first line on stderr
                        self.err_lines.append((time.monotonic() - self.t0,
                                               self.err.split(b"\n")[0].decode()))
                else:
                    now = time.monotonic() - self.t0
                    self._pending += data
                    while b"\n" in self._pending:
                        raw, self._pending = self._pending.split(b"\n", 1)
                        self.lines.append((now, raw.decode().rstrip("\r")))
        if until is not None and not until(self.lines):
            raise AssertionError(f"timed out; got {self.lines!r}")

    def finish(self, timeout: float = 600.0) -> int:
        """Read to the end (the command is killed after `timeout` seconds) and wait."""
        self.pump(timeout=timeout)
        try:
            rc = self.proc.wait(5)
        except subprocess.TimeoutExpired:  # still running at the timeout
            self.proc.kill()
            rc = self.proc.wait()
        os.close(self.out_m)
        os.close(self.err_m)
        return rc



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--term-after", metavar="LINE",
                    help="send SIGTERM once a stdout line starts with LINE")
    ap.add_argument("--timeout", type=float, default=3600.0,
                    help="kill the command after this many seconds (default 3600)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    run = PtyRun(*cmd)
    if args.term_after:
        run.pump(until=lambda lines: any(t.strip().startswith(args.term_after)
                                         for _, t in lines))
        run.proc.send_signal(signal.SIGTERM)
    rc = run.finish(args.timeout)
    for at, text in run.lines:
        print(f"{at:7.3f}s  {text}")
    for at, text in run.err_lines:
        print(f"{at:7.3f}s  (stderr, first line) {text}")
    tail = run.err.decode("utf-8", "replace").replace("\r", "\n").strip().splitlines()
    if tail:
        print(f"         (stderr, last line) {tail[-1]}")
    print(f"exit {rc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
