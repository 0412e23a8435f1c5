"""Running one ncnn graph in a child process and receiving every blob as it is computed.

`stream_blobs` yields `BlobEvent`s from a pipe (each array is the caller's to compare and
drop); `run_to_file` writes the frames to a scratch file the caller memory-maps
(`frames.FrameFile`). Either way the child is the one that may crash: the outcome says
how it ended and, for a crash, which blob it was computing.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from paramsurgery.core.npz import save_arrays

from paramsurgery.ir.graph import Graph
from paramsurgery.runtime.child import FeedLike, _as_feed
from paramsurgery.runtime.launch import module_argv, start_child
from paramsurgery.verify.compare.frames import read_frames

# layers whose extra tops are opaque runtime state (kv caches): never extracted
_CACHE_TOPS = {"SDPA": 7, "MultiHeadAttention": 7}


@dataclass
class NcnnSide:
    """One graph to run: its files and the ncnn Option settings (`options.parse_options`)."""

    param: str
    bin: str | None
    settings: dict[str, object]


@dataclass
class BlobEvent:
    name: str
    array: np.ndarray | None
    header: dict
    error: str | None = None


@dataclass
class Outcome:
    status: str = "ok"       # ok | crash | timeout | load_param_failed | input_failed | error
    message: str = ""
    computing: str | None = None   # the blob ncnn was computing when it died
    extracted: list[str] = field(default_factory=list)


def extractable_blobs(graph: Graph) -> list[tuple[str, int]]:
    """(blob, extract type) for every blob in graph order, kv-cache tops left out."""
    out: list[tuple[str, int]] = []
    for layer in graph:
        tops = layer.outputs
        if layer.type in _CACHE_TOPS and layer.params.get(_CACHE_TOPS[layer.type]):
            tops = tops[:1]
        out.extend((t, 0) for t in tops)
    return out


def cache_tops(graph: Graph) -> set[str]:
    """The opaque kv-cache tops `extractable_blobs` leaves out."""
    out: set[str] = set()
    for layer in graph:
        if layer.type in _CACHE_TOPS and layer.params.get(_CACHE_TOPS[layer.type]):
            out.update(layer.outputs[1:])
    return out


def _prepare(tmp: Path, side: NcnnSide, feeds: Mapping[str, FeedLike],
             blobs: list[tuple[str, int]], out: str | None) -> list[str]:
    as_feeds = {name: _as_feed(f) for name, f in feeds.items()}
    save_arrays(tmp / "inputs.npz", {f"i{i}": f.array for i, f in enumerate(as_feeds.values())})
    spec = {"param": os.path.abspath(side.param),
            "bin": None if side.bin is None else os.path.abspath(side.bin),
            "inputs": [[name, f.batch_index] for name, f in as_feeds.items()],
            "blobs": [list(b) for b in blobs], "options": side.settings, "out": out}
    (tmp / "spec.json").write_text(json.dumps(spec))
    return list(module_argv("paramsurgery.verify.compare.ncnn_child", tmp))


@contextlib.contextmanager
def _child(side: NcnnSide, feeds: Mapping[str, FeedLike], blobs: list[tuple[str, int]],
           out: str | None, stdout: int) -> Iterator[tuple[subprocess.Popen, Path]]:
    """The ncnn child, started on a scratch directory (removed afterwards) that holds its
    inputs, its spec and its stderr."""
    with tempfile.TemporaryDirectory(prefix="paramsurgery-compare-") as tmp:
        tmpdir = Path(tmp)
        cmd = _prepare(tmpdir, side, feeds, blobs, out)
        stderr_path = tmpdir / "stderr"
        with open(stderr_path, "wb") as err:
            proc = start_child(*cmd, stdout=stdout, stderr=err)
        yield proc, stderr_path


def _track(head: dict, outcome: Outcome) -> str | None:
    """Take a frame header's news into `outcome`: "blob" for a blob's frame (its name is
    recorded as extracted), "end" for the end marker, else None."""
    if "fatal" in head:
        outcome.status, outcome.message = head["fatal"], head.get("message", "")
    elif "computing" in head:
        outcome.computing = head["computing"]
    elif head.get("end"):
        outcome.computing = None
        return "end"
    elif "name" in head:
        outcome.extracted.append(head["name"])
        return "blob"
    return None


def _ended(proc: subprocess.Popen, outcome: Outcome, timed_out: bool, stderr_path: Path,
           saw_end: bool) -> None:
    rc = proc.wait()
    if outcome.status != "ok":
        return
    if timed_out:
        outcome.status, outcome.message = "timeout", "the ncnn run was stopped (timeout)"
    elif rc < 0:
        import signal

        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = f"signal {-rc}"
        outcome.status = "crash"
        outcome.message = f"ncnn died ({sig})" + (f" computing blob {outcome.computing}"
                                                   if outcome.computing else "")
    elif rc != 0 or not saw_end:
        outcome.status = "error"
        tail = stderr_path.read_text(errors="replace").strip().splitlines()[-3:]
        outcome.message = " / ".join(tail) or f"child exited with {rc}"


def stream_blobs(side: NcnnSide, feeds: Mapping[str, FeedLike], blobs: list[tuple[str, int]],
                 outcome: Outcome, timeout: float = 600.0) -> Iterator[BlobEvent]:
    """Run `side` in a child and yield each blob as ncnn produces it; `outcome` is filled
    in when the stream ends (check it after the loop)."""
    with _child(side, feeds, blobs, None, subprocess.PIPE) as (proc, stderr_path):
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        saw_end = False
        try:
            assert proc.stdout is not None
            for head, arr in read_frames(proc.stdout):
                kind = _track(head, outcome)
                saw_end = saw_end or kind == "end"
                if kind == "blob":
                    yield BlobEvent(head["name"], arr, head, head.get("error"))
        finally:
            timer.cancel()
            if proc.poll() is None and not saw_end and outcome.status == "ok":
                # the consumer stopped early (an exception): do not leave the child behind
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
            _ended(proc, outcome, killed.is_set(), stderr_path, saw_end)


def run_to_file(side: NcnnSide, feeds: Mapping[str, FeedLike], blobs: list[tuple[str, int]],
                path: str, timeout: float = 600.0) -> Outcome:
    """Run `side` in a child that writes every blob's frame to `path` (a scratch file)."""
    outcome = Outcome()
    with _child(side, feeds, blobs, path, subprocess.DEVNULL) as (proc, stderr_path):
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            timed_out = True
        saw_end = False
        from paramsurgery.verify.compare.frames import FrameFile

        with FrameFile(path) as ff:
            for head in ff.headers:
                saw_end = _track(head, outcome) == "end" or saw_end
        _ended(proc, outcome, timed_out, stderr_path, saw_end)
    return outcome
