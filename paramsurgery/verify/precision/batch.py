"""Many runs of variants of one graph, in child processes: the measurements of
`paramsurgery precision` (one variant per feature-mask assignment) and `quantize`.

A `Worker` is one long-lived child (`python -m paramsurgery.verify.precision.batch DIR`,
started through `runtime.launch`); each batch of variants (a `.param` text, ncnn Option
settings, the blobs to extract) is written to a directory it is told about on its stdin,
and it loads and runs them one after another, writing each result as it finishes. A crash
or a hang inside ncnn ends that variant only: the parent marks it (`crash`, with the
signal, or `timeout`) and starts a new child for the variants after it.
`run_variants(bin, feeds, variants)` is one batch in a worker of its own. Inputs are cloned
into ncnn-owned Mats, light mode is off (any blob can be extracted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from paramsurgery.core.npz import save_arrays
from paramsurgery.runtime.child import Feed, FeedLike, Fetch, _as_feed, _from_mat, _to_mat
from paramsurgery.runtime.launch import module_argv, start_child


@dataclass
class Variant:
    """One run: the graph's text, the ncnn Option attributes to set, the blobs to extract."""

    param_text: str
    settings: Mapping[str, object]
    blobs: Sequence[str]
    bin: str | None = None  # its own weights (quantize); None: the batch's
    feeds: Mapping[str, FeedLike] | None = None  # its own inputs; None: the worker's


@dataclass
class VariantResult:
    status: str  # ok | crash | timeout | load_param_failed | load_model_failed | error
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_variants(bin: str | None, feeds: Mapping[str, FeedLike], variants: Sequence[Variant],
                 *, timeout: float = 600.0) -> list[VariantResult]:
    """Every variant's result, in order (`timeout`: seconds per variant), in one worker."""
    with Worker(bin, feeds, timeout=timeout) as worker:
        return worker.run(variants)


class Worker:
    """One long-lived child for many batches of variants (a search runs several rounds:
    one Python start and ncnn import for all of them). A crash or hang ends the variant it
    was running; the next batch (or the rest of this one) gets a new child."""

    def __init__(self, bin: str | None, feeds: Mapping[str, FeedLike], *,
                 timeout: float = 600.0) -> None:
        self.bin = bin
        self.timeout = timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="paramsurgery-variants-")
        self.work = Path(self._tmp.name)
        (self.work / "inputs.json").write_text(json.dumps(
            _save_feeds(self.work / "inputs.npz", feeds)))
        self.proc: subprocess.Popen | None = None
        self.batches = 0

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop()
        self._tmp.cleanup()

    def _stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
            self.proc = None

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self._stop()
            self.stderr = open(self.work / "stderr", "ab")
            self.proc = start_child(*module_argv("paramsurgery.verify.precision.batch",
                                                 self.work),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=self.stderr, bufsize=0)
            self.stderr.close()
        return self.proc

    def run(self, variants: Sequence[Variant]) -> list[VariantResult]:
        batch = self.work / f"b{self.batches}"
        self.batches += 1
        batch.mkdir()
        own: list[list | None] = []
        for i, v in enumerate(variants):
            (batch / f"v{i}.param").write_text(v.param_text)
            own.append(None if v.feeds is None else _save_feeds(batch / f"i{i}.npz", v.feeds))
        spec = {"bin": self.bin, "variants": [{"settings": dict(v.settings),
                                               "blobs": list(v.blobs), "bin": v.bin,
                                               "inputs": names}
                                              for v, names in zip(variants, own)]}
        (batch / "spec.json").write_text(json.dumps(spec))
        results: list[VariantResult] = []
        while len(results) < len(variants):
            start = len(results)
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(f"{batch.name} {start}\n".encode())
            except BrokenPipeError:
                pass
            finished = _wait_line(proc, self.timeout * (len(variants) - start))
            done = start
            while done < len(variants) and (batch / f"r{done}.json").exists():
                results.append(_read_result(batch, done))
                done += 1
            if done < len(variants) and not finished:
                # the child died or hung inside variant `done`: that variant only
                hung = proc.poll() is None
                self._stop()
                how = "timeout" if hung else ("crash" if (proc.returncode or 0) < 0 else "error")
                what = f"no result after {self.timeout:.0f} s" if hung else \
                    f"child ended ({_how(proc.returncode)}) {_tail(self.work / 'stderr')}"
                results.append(VariantResult(how, message=f"variant {done}: {what}".strip()))
        return results


def _save_feeds(path: Path, feeds: Mapping[str, FeedLike]) -> list:
    """Write the arrays; [[name, batch_index], ...] in their order."""
    as_feeds = {name: _as_feed(f) for name, f in feeds.items()}
    save_arrays(path, {f"i{i}": f.array for i, f in enumerate(as_feeds.values())})
    return [[n, f.batch_index] for n, f in as_feeds.items()]


def _load_feeds(path: Path, names: list) -> dict[str, Feed]:
    with np.load(path) as data:
        return {name: Feed(data[f"i{k}"], bidx) for k, (name, bidx) in enumerate(names)}


def _how(rc: int | None) -> str:
    if rc is not None and rc < 0:
        import signal

        try:
            return f"signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


def _tail(path: Path, n: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " / ".join([ln for ln in text.strip().splitlines() if ln.strip()][-n:])


def _wait_line(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether the child reported the batch done ("done" on its stdout) within `timeout`."""
    import select

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return False
        chunk = os.read(fd, 4096)
        if not chunk:
            return False
        buf += chunk
        if b"\n" in buf:
            return buf.split(b"\n", 1)[0].strip() == b"done"


def _read_result(batch: Path, i: int) -> VariantResult:
    status = json.loads((batch / f"r{i}.json").read_text())
    arrays: dict[str, np.ndarray] = {}
    if status["status"] == "ok":
        with np.load(batch / f"r{i}.npz") as data:
            arrays = {n: data[f"b{k}"] for k, n in enumerate(status["names"])}
    return VariantResult(status["status"], arrays, status.get("message", ""))


# --------------------------------------------------------------------------- the child

def _load(param: Path, bin: str | None, settings: Mapping[str, object]):  # noqa: ANN202
    import ncnn

    net = ncnn.Net()
    for key, value in settings.items():
        if hasattr(net.opt, key):
            setattr(net.opt, key, value)
    net.opt.lightmode = True  # weights once (see runtime.child.load_net)
    if net.load_param(str(param)) != 0:
        return None, "load_param_failed"
    ret = net.load_model(ncnn.DataReaderFromEmpty()) if bin is None else net.load_model(bin)
    if ret != 0:
        return None, "load_model_failed"
    return net, "ok"


def _run_one(batch: Path, i: int, spec: dict, inputs: dict[str, Feed]) -> None:
    v = spec["variants"][i]
    if v.get("inputs") is not None:
        inputs = _load_feeds(batch / f"i{i}.npz", v["inputs"])
    net, status = _load(batch / f"v{i}.param", v["bin"] or spec["bin"], v["settings"])
    names: list[str] = []
    if net is not None:
        out: dict[str, np.ndarray] = {}
        with net.create_extractor() as ex:
            ex.set_light_mode(False)
            mats = {name: _to_mat(feed) for name, feed in inputs.items()}
            for name, mat in mats.items():
                if ex.input(name, mat) != 0:
                    status = "error"
            for k, blob in enumerate(v["blobs"]):
                if status != "ok":
                    break
                ret, mat = ex.extract(blob, 0)
                if ret != 0:
                    status = "error"
                    break
                out[f"b{k}"] = _from_mat(mat, Fetch(blob))
                names.append(blob)
        if status == "ok":
            save_arrays(batch / f"r{i}.npz", out)
    message = "" if status == "ok" else f"{status} in variant {i}"
    (batch / f"r{i}.json").write_text(json.dumps({"status": status, "names": names,
                                                  "message": message}))


def main(argv: list[str]) -> int:
    """Serve batches: each stdin line `BATCH START` runs BATCH's variants from START on, then
    answers `done`."""
    work = Path(argv[1])
    inputs = _load_feeds(work / "inputs.npz", json.loads((work / "inputs.json").read_text()))
    for line in sys.stdin:
        if not line.strip():
            continue
        name, start = line.split()
        batch = work / name
        spec = json.loads((batch / "spec.json").read_text())
        for i in range(int(start), len(spec["variants"])):
            _run_one(batch, i, spec, inputs)
        sys.stdout.write("done\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover - run by Worker
    sys.exit(main(sys.argv))
