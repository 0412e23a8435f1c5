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
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from paramsurgery.runtime.launch import start_child

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
    hang (no verdict within `timeout` seconds of the previous one) marks that file and the
    remaining files go to a fresh child."""
    if not available():
        return [Verdict("unavailable")] * len(files)
    verdicts: list[Verdict] = []
    with _LOCK:
        while len(verdicts) < len(files):
            verdicts.extend(_LOADER.serve(files[len(verdicts):], timeout))
    return verdicts


def prestart() -> None:
    """Start the loader child now, without waiting for it: its Python start and `import
    ncnn` then overlap whatever the caller does before its first load (lint parses the file
    and runs the other rules first)."""
    if available():
        with _LOCK:
            _LOADER.start()


class _Loader:
    """The child process that answers `load_verdicts`: it starts once per process (its
    Python start and `import ncnn` are ~100 ms, the load of a small file well under 1 ms),
    so `lint *.param`, `fix` (lint before and after) and the fuzz tests pay it once. Files
    are streamed to it while verdicts are read back, so a batch costs no round trip per
    file."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.tmp: str | None = None  # the child's scratch directory (mkdtemp: a forked
        # copy of this process must not remove it, as a TemporaryDirectory's finalizer would)
        self.owner = 0
        self.index = 0  # the child's number for the next file

    def start(self) -> subprocess.Popen:
        if self.proc is not None and self.proc.poll() is None and self.owner == os.getpid():
            return self.proc
        self.close()
        self.tmp = tempfile.mkdtemp(prefix="paramsurgery-ncnn-")
        scratch = os.path.join(self.tmp, "model.param")
        self.proc = start_child("-S", "-c", _CHILD, scratch, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_child_env(), bufsize=0)
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)
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
        if self.tmp is not None and self.owner == os.getpid():
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = None

    def serve(self, files: Sequence[bytes], timeout: float) -> list[Verdict]:
        """Verdicts of `files`, or of a prefix of them ending with the file that crashed or
        hung the child (which is then gone)."""
        proc = self.start()
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        base = self.index
        wfd: int | None = proc.stdin.fileno()
        readers = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err"}
        pending: bytes | memoryview = b""
        sent = 0
        out, err = b"", b""
        codes: dict[int, int] = {}
        done: list[Verdict] = []
        deadline = time.monotonic() + timeout
        while len(done) < len(files):
            if wfd is not None and not pending and sent < len(files):
                # a view: slicing off what each write took copies nothing
                pending = memoryview(len(files[sent]).to_bytes(8, "little") + files[sent])
                sent += 1
            left = deadline - time.monotonic()
            ready_r: list[int] = []
            ready_w: list[int] = []
            if left > 0:
                ready_r, ready_w, _ = select.select(
                    list(readers), [wfd] if pending and wfd is not None else [], [], left)
            if not ready_r and not ready_w:
                self.close()
                return done + [Verdict("hung", None, _split(_after_start(err, base + len(done))))]
            if ready_w and wfd is not None:
                try:
                    pending = pending[os.write(wfd, pending[:1 << 16]):]
                except BlockingIOError:
                    pass
                except BrokenPipeError:  # the child died: reading finds out how
                    wfd, pending = None, b""
            for fd in ready_r:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    del readers[fd]
                elif readers[fd] == "out":
                    out += chunk
                    *lines, out = out.split(b"\n")
                    for line in lines:
                        num, ret = line.split()
                        codes[int(num) - base] = int(ret)
                else:
                    err += chunk
            while len(done) in codes:  # the stdout verdict follows the stderr end marker
                i = base + len(done)
                end = err.find(b"\n\x02%d\n" % i)
                if end < 0:
                    break
                rc = codes.pop(len(done))
                done.append(Verdict("ok" if rc == 0 else "rejected", rc,
                                    _split(_after_start(err[:end], i))))
                err = err[end + len(b"\n\x02%d\n" % i):]
                deadline = time.monotonic() + timeout
            if not readers and len(done) < len(files):
                code = proc.wait()
                self.close()
                return done + [Verdict("crashed", code,
                                       _split(_after_start(err, base + len(done))))]
        self.index = base + len(files)
        return done


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
    """The child runs `python -S` (no site: its imports, editable-install finders included,
    are most of a start) with only ncnn's own directory on its path."""
    import importlib.util

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    spec = importlib.util.find_spec("ncnn")
    if spec is not None and spec.origin:
        where = os.path.dirname(spec.origin)
        if spec.submodule_search_locations:  # a package: its parent directory
            where = os.path.dirname(where)
        env["PYTHONPATH"] = os.pathsep.join(
            [where] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
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
