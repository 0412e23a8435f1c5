"""ncnn's own `.param` loader as an oracle, run in a child process.

ncnn's grammar is defined by what `Net::load_param` accepts, and the wheel's parser is not
published; so instead of re-deriving every rule we ask it. The loader may crash on hostile
input, so it runs in a child `python` that imports only `ncnn`. One child, started on first
use, serves every load of the process (the fuzz tests load 100,000 files, `lint *.param`
one per file): the child writes a marker to stderr before each load and the verdict to
stdout after it, so a crash or a hang is pinned to the file that caused it and the next
file goes to a fresh child.

A verdict is ncnn's return code and the messages ncnn printed while loading that file
(`"too many blobs at layer 2 top 0"`), or `crashed`/`hung` with no return code.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

BINARY_MAGIC = b"\xdd\x85\x76\x00"

# Runs in the child: read length-prefixed files from stdin, load each with ncnn, report.
_CHILD = r"""
import os, sys, struct
import ncnn
src = sys.stdin.buffer
out = sys.stdout
tmp = sys.argv[1]
i = 0
while True:
    head = src.read(8)
    if len(head) < 8:
        break
    (n,) = struct.unpack("<Q", head)
    data = src.read(n)
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.write(2, b"\n\x01%d\n" % i)
    net = ncnn.Net()
    rc = net.load_param_bin(tmp) if data[:4] == b"\xdd\x85\x76\x00" else net.load_param(tmp)
    del net
    os.write(2, b"\n\x02%d\n" % i)
    out.write("%d %d\n" % (i, rc))
    out.flush()
    i += 1
"""



@dataclass(frozen=True)
class Verdict:
    """What ncnn's loader made of one file."""

    status: str  # "ok", "rejected", "crashed", "hung", "unavailable"
    code: int | None = None
    messages: tuple[str, ...] = ()

    @property
    def loads(self) -> bool:
        return self.status == "ok"

    @property
    def rejects(self) -> bool:
        return self.status in ("rejected", "crashed", "hung")

    @property
    def message(self) -> str:
        if self.status == "crashed":
            return "ncnn's loader crashed"
        if self.status == "hung":
            return "ncnn's loader did not finish"
        return "; ".join(self.messages) or f"load_param returned {self.code}"


def available() -> bool:
    """Whether the ncnn python module is installed (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("ncnn") is not None


def load_verdicts(files: Sequence[bytes], timeout: float = 20.0) -> list[Verdict]:
    """ncnn's verdict on each file's bytes, in order. One long-lived child process (started
    on first use, shared by every call in this process) loads them in turn; a crash or a
    hang (no verdict within `timeout` seconds) marks that file and the next file goes to a
    fresh child."""
    if not available():
        return [Verdict("unavailable")] * len(files)
    with _LOCK:
        return [_LOADER.verdict(data, timeout) for data in files]


class _Loader:
    """The child process that answers `load_verdicts`: it starts once per process (its
    Python start and `import ncnn` are ~100 ms, the load of a small file well under 1 ms),
    so `lint *.param`, `fix` (lint before and after) and the fuzz tests pay it once."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None
        self.owner = 0
        self.index = 0

    def start(self) -> subprocess.Popen:
        if self.proc is not None and self.proc.poll() is None and self.owner == os.getpid():
            return self.proc
        self.close()
        self.tmp = tempfile.TemporaryDirectory(prefix="paramsurgery-ncnn-")
        scratch = os.path.join(self.tmp.name, "model.param")
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, scratch],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=_child_env(), bufsize=0)
        self.owner, self.index = os.getpid(), 0
        return self.proc

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and self.owner == os.getpid():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for fh in (proc.stdin, proc.stdout, proc.stderr):
                if fh is not None:
                    fh.close()
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None

    def verdict(self, data: bytes, timeout: float) -> Verdict:
        proc = self.start()
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        i = self.index
        self.index += 1
        try:
            proc.stdin.write(len(data).to_bytes(8, "little") + data)
        except BrokenPipeError:
            pass  # the child died: reading below finds out how
        out, err = b"", b""
        done_out = re.compile(rb"(?:^|\n)%d (-?[0-9]+)\n" % i)
        end_mark = b"\n\x02%d\n" % i
        deadline = time.monotonic() + timeout
        streams = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err"}
        while streams:
            left = deadline - time.monotonic()
            ready = select.select(list(streams), [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                self.close()
                return Verdict("hung", None, _split(_after_start(err, i)))
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    del streams[fd]
                elif streams[fd] == "out":
                    out += chunk
                else:
                    err += chunk
            m = done_out.search(out)
            if m is not None and end_mark in err:
                return Verdict("ok" if m.group(1) == b"0" else "rejected", int(m.group(1)),
                               _split(_after_start(err[:err.index(end_mark)], i)))
        code = proc.wait()
        self.close()
        return Verdict("crashed", code, _split(_after_start(err, i)))


def _after_start(err: bytes, i: int) -> bytes:
    mark = b"\n\x01%d\n" % i
    at = err.find(mark)
    return err[at + len(mark):] if at >= 0 else b""


_LOCK = threading.Lock()
_LOADER = _Loader()
atexit.register(_LOADER.close)


def _split(raw: bytes) -> tuple[str, ...]:
    return tuple(ln.strip() for ln in raw.decode("utf-8", "replace").splitlines() if ln.strip())


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def load_verdict_for_path(path: str | os.PathLike, timeout: float = 20.0) -> Verdict:
    """ncnn's verdict on a file on disk."""
    return load_verdicts([Path(path).read_bytes()], timeout)[0]


# ------------------------------------------------------------------ message → location

_LAYER_INDEX = re.compile(
    r"(?:too many blobs at layer|invalid shape hints at layer|invalid feature mask at layer"
    r"|one_blob_only layer|ParamDict load_param|layer load_param|layer) (-?[0-9]+)")


def layer_index_of(message: str) -> int | None:
    """The layer index an ncnn load message names, if any (`layer load_param 3 p failed`)."""
    m = _LAYER_INDEX.search(message)
    return int(m.group(1)) if m else None


HEADER_MESSAGES = ("param is too old", "invalid layer_count or blob_count", "parse magic",
                   "parse layer_count", "parse blob_count")


def is_header_message(message: str) -> bool:
    return any(message.startswith(h) for h in HEADER_MESSAGES)
