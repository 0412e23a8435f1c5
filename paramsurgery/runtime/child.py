"""Running a graph through the real ncnn runtime: the oracle for every numeric check.

`run` works in-process; `run_isolated` runs the same thing in a child process so a
segfault or SIGFPE in ncnn (parameterless Slice, empty Concat, ...) becomes a
`RunResult` with a status instead of killing the caller.

Conventions (see ncnn-format.md §6): every fp16/bf16 option is off so results are
bit-stable fp32; inputs are cloned into ncnn-owned Mats (a borrowed numpy buffer can
dangle); int32 arrays keep their bits (Embed reads int32 bit patterns);
`batch_index` is pnnx's convention for which numpy axis is ncnn's batch ``n``
(233 = no batch axis).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union

import numpy as np

from paramsurgery.core.npz import save_arrays
from paramsurgery.runtime.launch import module_argv, run_child

from paramsurgery.core.ncnn import NO_BATCH


@dataclass
class Feed:
    """One input: the array and the numpy axis that is ncnn's batch axis (233 = none)."""

    array: np.ndarray
    batch_index: int = NO_BATCH


@dataclass
class Fetch:
    """One output to extract: blob name, extract type (1 = raw, for SDPA kv caches),
    and the batch axis to restore in numpy (233 = none)."""

    name: str
    batch_index: int = NO_BATCH
    type: int = 0


FeedLike = Union[np.ndarray, Feed]
FetchLike = Union[str, Fetch]


@dataclass
class RunOptions:
    num_threads: int = 1
    light_mode: bool = True
    fp32: bool = True
    packing: bool = True
    # blobs from a size-checked pool freed after each run (`pooled_net`): for runs whose
    # inputs are all numpy arrays (no kv cache Mats carried from one run to the next)
    pool: bool = False

    def apply(self, net) -> None:
        opt = net.opt
        if self.fp32:
            for key in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic",
                        "use_bf16_storage", "use_bf16_packed"):
                if hasattr(opt, key):
                    setattr(opt, key, False)
        opt.num_threads = self.num_threads
        opt.lightmode = self.light_mode
        opt.use_packing_layout = self.packing
        opt.use_vulkan_compute = False


@dataclass
class RunResult:
    """Outcome of an isolated run. status: ok | load_param_failed | load_model_failed |
    input_failed | extract_failed | crash | error."""

    status: str
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    message: str = ""
    signal: int | None = None
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        if self.status == "crash" and self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"crash ({name})"
        return self.status + (f": {self.message}" if self.message else "")


class NcnnRunError(RuntimeError):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def write_child_result(out_path: Path, work: Callable[[], dict]) -> int:
    """A run-in-child's last act: `work()`'s result as JSON in `out_path`, or
    {"error": message} when ncnn failed on the way (an NcnnRunError, or a RuntimeError
    the child raised on a non-zero ncnn return); the parent reads the file, so exit 0."""
    try:
        result = work()
    except RuntimeError as exc:  # NcnnRunError is one
        result = {"error": str(exc)}
    out_path.write_text(json.dumps(result))
    return 0


def _as_feed(value: FeedLike) -> Feed:
    return value if isinstance(value, Feed) else Feed(np.asarray(value))


def _as_fetch(value: FetchLike) -> Fetch:
    return value if isinstance(value, Fetch) else Fetch(value)


def _to_mat(feed: Feed):
    import ncnn

    arr = feed.array
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    elif arr.dtype == np.int64:
        arr = arr.astype(np.int32)
    arr = np.ascontiguousarray(arr)
    if arr.dtype not in (np.float32, np.int32):
        raise TypeError(f"ncnn inputs must be float32 or int32, got {arr.dtype}")
    if arr.size == 0:
        return ncnn.Mat()
    if feed.batch_index != NO_BATCH:
        return ncnn.Mat(arr, batch_index=feed.batch_index).clone()
    mat = ncnn.Mat(arr)
    clone = mat.clone()
    del mat
    return clone


def _from_mat(mat, fetch: Fetch) -> np.ndarray:
    if mat.dims == 0:
        return np.zeros((0,), np.float32)
    if fetch.type == 1:
        # raw internal blob (packed layouts, kv caches): only the logical shape is meaningful
        return np.array(mat.numpy(), copy=True)
    if fetch.batch_index != NO_BATCH:
        return np.array(mat.numpy(batch_index=fetch.batch_index), copy=True)
    if getattr(mat, "n", 1) > 1:
        # ncnn put something in the batch axis the caller did not expect (pnnx case 7):
        # return every batch item (leading axis) instead of silently only the first
        return np.array(mat.numpy(batch_index=0), copy=True)
    return np.array(mat, copy=True)


# a pooled block serves a request only when the request is at least this share of its size
POOL_SIZE_RATIO = 0.75
_POOLED_NET_CLASSES: dict[type, type] = {}


def pooled_net():  # noqa: ANN201 - an ncnn.Net
    """A new `ncnn.Net` whose extractors allocate blobs from a pool that reuses a free block
    only for a request of at least 3/4 its size (`RunOptions.pool`).

    Without it each net makes its own pool at load time with no size check: a freed block
    of the largest activation serves the next small request and the next large one is
    allocated again (the real codec conv stack on 12 frames: 99 MB of activations against
    65 MB). The pool is an attribute of the net (a Python subclass of ncnn.Net: pybind
    objects take no attributes), released with it.

    Only for runs that pass no ncnn Mat from one extractor to the next: with a blob
    allocator of its own, ncnn's SDPA kv cache fed back as extracted (type 1) gives wrong
    numbers from the first cached step on (tests/test_kvcache.py's parity, ncnn 1.0.20261020)."""
    import ncnn

    base = ncnn.Net
    cls = _POOLED_NET_CLASSES.get(base)
    if cls is None:
        cls = _POOLED_NET_CLASSES[base] = type("PooledNet", (base,), {})
    net = cls()
    net.pools = (ncnn.PoolAllocator(),)
    net.pools[0].set_size_compare_ratio(POOL_SIZE_RATIO)
    net.opt.blob_allocator = net.pools[0]
    return net


def load_net(param: str | os.PathLike, bin: str | os.PathLike | bytes | None = None,
             options: RunOptions | None = None):
    """Load a net with fp32 options; `param` is a path or the text itself (contains a newline).
    `bin=None` serves zeros-free empty weights (DataReaderFromEmpty).

    The weights are always loaded in light mode: a layer that repacks its weights for its
    kernels (Gemm, Convolution, ...) frees the originals only then, so a net loaded with
    light mode off holds its weights twice. `options.light_mode` is applied after loading:
    it governs the extractors (whether intermediate blobs are kept), which is what a caller
    turning it off wants."""
    import ncnn

    options = options or RunOptions()
    net = pooled_net() if options.pool else ncnn.Net()
    options.apply(net)
    net.opt.lightmode = True
    param_s = os.fspath(param)
    if "\n" in param_s:
        ret = net.load_param_mem(param_s)
    elif param_s.endswith(".bin"):
        ret = net.load_param_bin(param_s)
    else:
        ret = net.load_param(param_s)
    if ret != 0:
        raise NcnnRunError("load_param_failed", f"ncnn load_param returned {ret}")
    if bin is None:
        ret = net.load_model(ncnn.DataReaderFromEmpty())
    elif isinstance(bin, (bytes, bytearray)):
        net.load_model_mem(bytes(bin))
        ret = 0
    else:
        ret = net.load_model(os.fspath(bin))
    if ret != 0:
        raise NcnnRunError("load_model_failed", f"ncnn load_model returned {ret}")
    net.opt.lightmode = options.light_mode  # inherited by every extractor of this net
    return net


def run_net(net, inputs: Mapping[str, FeedLike], outputs: Sequence[FetchLike],
            light_mode: bool | None = None) -> dict[str, np.ndarray]:
    """Feed `inputs` and extract `outputs` from an already loaded net."""
    mats = {name: _to_mat(_as_feed(v)) for name, v in inputs.items()}
    result: dict[str, np.ndarray] = {}
    fetches = list(map(_as_fetch, outputs))
    if light_mode is None and len(fetches) > 1:
        # light mode frees a blob once its consumer ran; extracting an intermediate after a
        # blob downstream of it then crashes ncnn. Several fetches: keep everything.
        light_mode = False
    with net.create_extractor() as ex:
        if light_mode is not None:
            ex.set_light_mode(light_mode)
        for name, mat in mats.items():
            ret = ex.input(name, mat)
            if ret != 0:
                raise NcnnRunError("input_failed", f"ex.input({name!r}) returned {ret}")
        for spec in fetches:
            ret, mat = ex.extract(spec.name, spec.type)
            if ret != 0:
                raise NcnnRunError("extract_failed", f"ex.extract({spec.name!r}) returned {ret}")
            result[spec.name] = _from_mat(mat, spec)
    release_pools(net)
    return result


def release_pools(net) -> None:  # noqa: ANN001 - an ncnn.Net
    """Give the free blocks of the net's pools (`pooled_net`) back: a pool keeps every block
    it handed out, and runs of different lengths (stream chunks, growing kv caches) each
    leave blocks of their own sizes, which then add up. Each run allocates afresh (page
    faults on a few MB: far less than the run itself at the sizes where memory matters)."""
    for pool in getattr(net, "pools", ()):
        pool.clear()


def run(param: str | os.PathLike, bin: str | os.PathLike | bytes | None,
        inputs: Mapping[str, FeedLike], outputs: Sequence[FetchLike],
        options: RunOptions | None = None) -> dict[str, np.ndarray]:
    """Load and run in this process. Raises `NcnnRunError` on a load/input/extract failure.
    A crash inside ncnn kills this process: use `run_isolated` for untrusted graphs."""
    net = load_net(param, bin, options)
    return run_net(net, inputs, outputs)


# --------------------------------------------------------------------------- isolation

def run_isolated(param: str | os.PathLike, bin: str | os.PathLike | None,
                 inputs: Mapping[str, FeedLike], outputs: Sequence[FetchLike],
                 options: RunOptions | None = None, timeout: float = 600.0) -> RunResult:
    """`run` in a child process. Never raises for ncnn failures: the status says what
    happened (a signal number for crashes)."""
    options = options or RunOptions()
    with tempfile.TemporaryDirectory(prefix="paramsurgery-run-") as tmp:
        tmpdir = Path(tmp)
        param_s = os.fspath(param)
        if "\n" in param_s:
            (tmpdir / "graph.param").write_text(param_s)
            param_s = str(tmpdir / "graph.param")
        feeds = {name: _as_feed(v) for name, v in inputs.items()}
        save_arrays(tmpdir / "inputs.npz", {f"i{i}": f.array for i, f in enumerate(feeds.values())})
        spec = {
            "param": param_s,
            "bin": None if bin is None else os.fspath(bin),
            "inputs": [[name, f.batch_index] for name, f in feeds.items()],
            "outputs": [[f.name, f.batch_index, f.type] for f in map(_as_fetch, outputs)],
            "options": options.__dict__,
        }
        (tmpdir / "spec.json").write_text(json.dumps(spec))
        proc = run_child(*module_argv("paramsurgery.runtime.child", tmpdir), timeout=timeout)
        if proc.timed_out:
            return RunResult("timeout", message=f"no result after {timeout:.0f} s")
        status_file = tmpdir / "status.json"
        if proc.signal is not None:
            return RunResult("crash", signal=proc.signal, stderr=proc.stderr,
                             message=proc.tail(5, "\n"))
        if not status_file.exists():
            return RunResult("error", message=proc.tail(5, "\n") or
                             f"child exited with {proc.returncode}", stderr=proc.stderr)
        status = json.loads(status_file.read_text())
        outputs_np: dict[str, np.ndarray] = {}
        if status["status"] == "ok":
            with np.load(tmpdir / "outputs.npz") as data:
                outputs_np = {name: data[f"o{i}"] for i, name in enumerate(status["names"])}
        return RunResult(status["status"], outputs_np, status.get("message", ""),
                         stderr=proc.stderr)


def run_module_child(module: str, arg: str | os.PathLike, result: Path,
                     timeout: float, on_line: Callable[[str], None] | None = None
                     ) -> str | None:
    """Run `python -m <module> <arg>` (a child that writes `result`); None when it did, else
    what went wrong (signal or exit code and the end of its stderr). `on_line`: each line
    the child prints on stdout, as it prints it (finished steps, for progress)."""
    if on_line is not None:
        from paramsurgery.runtime.launch import stream_child

        proc = stream_child(*module_argv(module, arg), timeout=timeout, on_line=on_line)
    else:
        proc = run_child(*module_argv(module, arg), timeout=timeout)
    if proc.ok and result.exists():
        return None
    return f"ncnn run failed ({proc.how()}) {proc.tail()}".strip()


def _child(tmpdir: Path) -> int:
    spec = json.loads((tmpdir / "spec.json").read_text())
    options = RunOptions(**spec["options"])
    with np.load(tmpdir / "inputs.npz") as data:
        inputs = {name: Feed(data[f"i{i}"], bidx) for i, (name, bidx) in enumerate(spec["inputs"])}
    fetches = [Fetch(name, bidx, typ) for name, bidx, typ in spec["outputs"]]
    try:
        outs = run(spec["param"], spec["bin"], inputs, fetches, options)
    except NcnnRunError as exc:
        (tmpdir / "status.json").write_text(json.dumps({"status": exc.status,
                                                        "message": exc.message}))
        return 0
    names = list(outs)
    save_arrays(tmpdir / "outputs.npz", {f"o{i}": outs[n] for i, n in enumerate(names)})
    (tmpdir / "status.json").write_text(json.dumps({"status": "ok", "names": names}))
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through run_isolated
    sys.exit(_child(Path(sys.argv[1])))
