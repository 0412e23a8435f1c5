"""ncnn's own `.param` loader as an oracle, run in a child process.

ncnn's grammar is defined by what `Net::load_param` accepts, and the wheel's parser is not
published; so instead of re-deriving every rule we ask it. The loader may crash on hostile
input, so it runs in a child `python` that imports only `ncnn`. Many files go through one
child (the fuzz tests load 100,000 of them): the child writes a marker to stderr before each
load and the verdict to stdout after it, so a crash or a hang is pinned to the file that
caused it and the rest of the batch resumes in a fresh child.

A verdict is ncnn's return code and the messages ncnn printed while loading that file
(`"too many blobs at layer 2 top 0"`), or `crashed`/`hung` with no return code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

BINARY_MAGIC = b"\xdd\x85\x76\x00"
_BATCH_BYTES = 64 << 20  # bytes of files piped to one child

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

_MARK = re.compile(rb"\n\x01([0-9]+)\n(.*?)(?:\n\x02\1\n|\Z)", re.S)


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
    """ncnn's verdict on each file's bytes. One child process loads them all in turn; a
    crash or a hang (no verdict within `timeout` seconds of the previous one) marks that
    file and the remaining files go to a new child."""
    if not available():
        return [Verdict("unavailable")] * len(files)
    verdicts: list[Verdict] = []
    with tempfile.TemporaryDirectory(prefix="paramsurgery-ncnn-") as tmp:
        scratch = os.path.join(tmp, "model.param")
        while len(verdicts) < len(files):
            start = end = len(verdicts)
            size = 0
            while end < len(files) and (end == start or size + len(files[end]) < _BATCH_BYTES):
                size += len(files[end])
                end += 1
            verdicts.extend(_run_batch(files[start:end], scratch, timeout))
    return verdicts


def _run_batch(files: Sequence[bytes], scratch: str, timeout: float) -> list[Verdict]:
    payload = b"".join(len(f).to_bytes(8, "little") + f for f in files)
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, scratch], stdin=subprocess.PIPE,
                                stdout=out, stderr=err, env=_child_env())
        hung = False
        try:
            proc.communicate(payload, timeout=timeout + 0.002 * len(files))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            hung = True
        except BrokenPipeError:  # the child died before reading everything
            proc.wait()
        out.seek(0)
        err.seek(0)
        codes = [int(line.split()[1]) for line in out.read().decode().splitlines() if line]
        messages = {int(m.group(1)): m.group(2) for m in _MARK.finditer(err.read())}
    verdicts = [Verdict("ok" if rc == 0 else "rejected", rc, _split(messages.get(i, b"")))
                for i, rc in enumerate(codes)]
    if len(verdicts) < len(files):
        if hung:
            verdicts.append(Verdict("hung"))
        elif proc.returncode != 0:
            verdicts.append(Verdict("crashed", proc.returncode,
                                    _split(messages.get(len(verdicts), b""))))
        # else: the child stopped early without a crash (cannot happen); retry the rest
    return verdicts


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
