"""Host side of streaming conv state: feed frame chunks through the graph `add-conv-cache`
wrote, following its manifest.

    runner = StreamingRunner("out.param", "out.bin", "out.json")
    for chunk in chunks:                 # frames along the input's time axis
        audio = runner.push(chunk)       # the samples that became final
    tail = runner.flush()                # the rest (nothing for causal stacks); resets

`check_stream` (the engine of `paramsurgery stream-check`) converts a model, streams random
frames in the given chunking and compares against running the original graph on all frames
at once: the concatenation must match, and every chunk must emit exactly the earliest
possible count.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

import numpy as np

from paramsurgery.core.errors import ParamSurgeryError, VerificationError
from paramsurgery.runtime.child import RunOptions, load_net, run_net
from paramsurgery.formats.param_text import dump_bytes


def load_manifest(manifest: str | os.PathLike | Mapping[str, Any]) -> dict:
    if isinstance(manifest, Mapping):
        return dict(manifest)
    path = os.fspath(manifest)
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ParamSurgeryError("no such file", file=path) from None
    except json.JSONDecodeError as exc:
        raise ParamSurgeryError(f"not a JSON manifest: {exc}", file=path) from None
    if data.get("format") != "paramsurgery-streaming":
        raise ParamSurgeryError("not a paramsurgery streaming manifest (format)", file=path)
    data["_dir"] = os.path.dirname(os.path.abspath(path))
    return data


def emitted_after(manifest: Mapping[str, Any], frames: int, output: str | None = None) -> int:
    """Samples an output has emitted in total after `frames` frames: the earliest-possible
    count `max(0, samples_per_frame * n - start_trim)` (0 while the start is buffered)."""
    out = _output(manifest, output)
    if frames < manifest["stream_start"]["buffer_frames"]:
        return 0
    return max(0, out["samples_per_frame"] * frames - out["start_trim"])


def _output(manifest: Mapping[str, Any], name: str | None) -> dict:
    outs = manifest["outputs"]
    if name is None:
        return outs[0]
    for o in outs:
        if o["name"] == name:
            return o
    raise KeyError(name)


class StreamingRunner:
    """Push frame chunks through a streaming graph; see the module doc.

    `push(frames)` takes one array (one input) or a mapping input name -> array, frames along
    each input's time axis (`manifest["inputs"][i]["numpy_axis"]`), and returns the newly
    final samples of the first output (`push_all` returns every output by name). `flush()`
    returns what is left (empty for the causal stacks the pass accepts) and resets the stream;
    `reset()` starts a new stream without flushing."""

    def __init__(self, param: str | os.PathLike, bin: str | os.PathLike | None,
                 manifest: str | os.PathLike | Mapping[str, Any], *,
                 start_param: str | os.PathLike | None = None, num_threads: int = 1,
                 options: RunOptions | None = None, light_mode: bool = True,
                 one_net: bool = False) -> None:
        self.manifest = load_manifest(manifest)
        m = self.manifest
        options = options or RunOptions(num_threads=num_threads, pool=True)
        if start_param is None and m.get("start_param"):
            start_param = os.path.join(m.get("_dir") or os.path.dirname(os.fspath(param)),
                                       m["start_param"])
        if m["stream_start"]["graph"] == "start_param" and start_param is None:
            raise ParamSurgeryError("the manifest needs a start graph (start_param) and none "
                                    "was given")
        # `one_net`: the start graph and the steady one share the weights; hold one net at a
        # time (the other is loaded when the stream needs it: at its start, after it) so a
        # check never has the weights resident twice
        self._load = {"steady": lambda: load_net(param, bin, options),
                      "start": (lambda: load_net(start_param, bin, options)) if start_param
                      else None}
        self.one_net = one_net and start_param is not None
        self._nets: dict[str, Any] = {}
        if not self.one_net:
            self._nets = {k: f() for k, f in self._load.items() if f is not None}
        self.inputs = m["inputs"]
        self.outputs = m["outputs"]
        self.states = m["states"]
        self.buffer_frames = int(m["stream_start"]["buffer_frames"])
        self.calls: list[dict] = []  # per push: frames fed, seconds spent in ncnn
        # light mode frees every intermediate blob once read: safe here because everything
        # fetched (outputs, conv_state_out_<i>) is a leaf of the graph
        self.light_mode = light_mode
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        self._state = {s["in"]: np.full(s["numpy_shape"], s["init"].get("fill", 0.0),
                                        np.float32) for s in self.states}
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_frames = 0
        self.started = False
        self.frames_in = 0
        self.emitted = {o["name"]: 0 for o in self.outputs}

    def _as_inputs(self, frames: Any) -> dict[str, np.ndarray]:
        if isinstance(frames, Mapping):
            missing = {i["name"] for i in self.inputs} - set(frames)
            if missing:
                raise ParamSurgeryError(f"push: missing input(s) {', '.join(sorted(missing))}")
            return {k: np.ascontiguousarray(v, np.float32) for k, v in frames.items()}
        if len(self.inputs) != 1:
            raise ParamSurgeryError("push: the graph has several inputs; pass a mapping")
        return {self.inputs[0]["name"]: np.ascontiguousarray(frames, np.float32)}

    def _frames(self, feeds: Mapping[str, np.ndarray]) -> int:
        counts = set()
        for i in self.inputs:
            a = feeds[i["name"]]
            ax = i["numpy_axis"]
            if a.ndim != len(i["numpy_shape"]):
                raise ParamSurgeryError(f"push: input {i['name']!r} must be "
                                        f"{len(i['numpy_shape'])}-D "
                                        f"{_fmt_shape(i['numpy_shape'])}, got {a.shape}")
            for d, (want, got) in enumerate(zip(i["numpy_shape"], a.shape)):
                if d != ax and isinstance(want, int) and want != got:
                    raise ParamSurgeryError(f"push: input {i['name']!r} must be "
                                            f"{_fmt_shape(i['numpy_shape'])}, got {a.shape}")
            counts.add(a.shape[ax])
        if len(counts) != 1:
            raise ParamSurgeryError(f"push: inputs disagree on the frame count {sorted(counts)}")
        return counts.pop()

    def _empty(self, o: dict) -> np.ndarray:
        shape = [0 if v == "T" else (v if isinstance(v, int) else 0) for v in o["numpy_shape"]]
        return np.zeros(shape, np.float32)

    # ------------------------------------------------------------------ push / flush
    def push_all(self, frames: Any) -> dict[str, np.ndarray]:
        feeds = self._as_inputs(frames)
        n = self._frames(feeds)
        empty = {o["name"]: self._empty(o) for o in self.outputs}
        if n == 0:
            return empty
        self.frames_in += n
        which = "steady"
        if not self.started:
            self._pending.append(feeds)
            self._pending_frames += n
            if self._pending_frames < self.buffer_frames:
                self.calls.append({"frames": n, "seconds": 0.0, "buffered": True})
                return empty
            feeds = {i["name"]: np.concatenate([p[i["name"]] for p in self._pending],
                                               axis=i["numpy_axis"]) for i in self.inputs}
            self._pending = []
            self.started = True
            if self._load["start"] is not None:
                which = "start"
        net = self._net(which)
        t0 = time.perf_counter()
        fetch = [o["name"] for o in self.outputs] + [s["out"] for s in self.states]
        res = run_net(net, {**feeds, **self._state}, fetch, light_mode=self.light_mode)
        dt = time.perf_counter() - t0
        for s in self.states:
            new = res[s["out"]]
            if tuple(new.shape) != tuple(s["numpy_shape"]):
                raise VerificationError(f"state {s['out']!r} came back {new.shape}, expected "
                                        f"{tuple(s['numpy_shape'])}")
            self._state[s["in"]] = new
        out = {o["name"]: res[o["name"]] for o in self.outputs}
        for o in self.outputs:
            self.emitted[o["name"]] += out[o["name"]].shape[o["numpy_axis"]]
        self.calls.append({"frames": n, "seconds": dt, "buffered": False})
        return out

    def push(self, frames: Any) -> np.ndarray:
        return self.push_all(frames)[self.outputs[0]["name"]]

    def _net(self, which: str) -> Any:
        net = self._nets.get(which)
        if net is None:
            load = self._load[which]
            assert load is not None, which
            self._nets.clear()  # one_net: free the other first
            net = self._nets[which] = load()
        return net

    @property
    def net(self) -> Any:
        """The steady-state net."""
        return self._net("steady")

    @property
    def start_net(self) -> Any:
        """The net of the stream's first call (None when the steady one starts it)."""
        return self._net("start") if self._load["start"] is not None else None

    def flush_all(self) -> dict[str, np.ndarray]:
        """What is left after the last frame (nothing: every transposed conv trims exactly
        its pending tail); resets the stream."""
        out = {o["name"]: self._empty(o) for o in self.outputs}
        self.reset()
        return out

    def flush(self) -> np.ndarray:
        return self.flush_all()[self.outputs[0]["name"]]


def _fmt_shape(shape: Sequence) -> str:
    return "(" + ", ".join(str(v) if v is not None else "?" for v in shape) + ")"


# ============================================================================ convert + check

@dataclass
class Converted:
    """Files written by `convert`: the streaming graph, its weights, the start graph (or None)
    and the manifest."""

    param: str
    bin: str
    start_param: str | None
    manifest_path: str
    manifest: dict
    result: Any = None


def output_paths(out: str) -> tuple[str, str, str, str]:
    """`out` (a prefix, or a path ending in .param) -> (param, bin, start param, manifest)."""
    base = out[:-len(".param")] if out.endswith(".param") else out
    return base + ".param", base + ".bin", base + ".start.param", base + ".json"


def stream_manifest(result: Any, param_out: str, bin_out: str, start_out: str | None,
                    param: str | os.PathLike | None, bin: str | os.PathLike | None) -> dict:
    """The host manifest of an `add-conv-cache` result, naming the files it is written to
    (`start_out` None: no start graph) and the source files."""
    manifest = dict(result.data["manifest"])
    manifest["param"] = os.path.basename(param_out)
    manifest["bin"] = os.path.basename(bin_out)
    manifest["start_param"] = os.path.basename(start_out) if start_out is not None else None
    manifest["source"] = {"param": os.fspath(param) if param is not None else None,
                          "bin": os.fspath(bin) if bin is not None else None}
    return manifest


def convert(param: str | os.PathLike, bin: str | os.PathLike | None, out: str, *,
            time_axis: Any = None, graph: Any = None,
            inputshape: Mapping[str, tuple] | None = None) -> Converted:
    """Load, run `add-conv-cache`, write out.param, out.bin, out.json (+ out.start.param when
    the stream has start trims) atomically, all renamed into place together."""
    from paramsurgery.core.fs import atomic_write_many
    from paramsurgery.formats.io import load
    from paramsurgery.passes.conv_cache import AddConvCache
    from paramsurgery.formats.weights import write_weights

    p_path, b_path, s_path, m_path = output_paths(out)
    directory = os.path.dirname(os.path.abspath(p_path))
    if not os.path.isdir(directory):
        raise ParamSurgeryError("no such directory", file=directory)
    g = graph if graph is not None else load(param, bin=bin)
    result = AddConvCache(time_axis, inputshape=inputshape)(g)
    start = result.data["start_graph"]
    manifest = stream_manifest(result, p_path, b_path, s_path if start is not None else None,
                               param, bin)
    steady = result.graph
    writers: dict[str | os.PathLike, Callable[[IO], object]] = {
               p_path: lambda fh: fh.write(dump_bytes(steady)),
               b_path: lambda fh: write_weights(steady, fh),
               m_path: lambda fh: fh.write((json.dumps(manifest, indent=2) + "\n").encode())}
    if start is not None:
        writers[s_path] = lambda fh: fh.write(dump_bytes(start))
    atomic_write_many(writers)
    manifest["_dir"] = os.path.dirname(os.path.abspath(m_path))
    return Converted(p_path, b_path, s_path if start is not None else None, m_path, manifest,
                     result)


@dataclass
class ChunkReport:
    frames: int
    emitted: int
    expected: int


@dataclass
class StreamCheck:
    ok: bool
    chunks: list[ChunkReport] = field(default_factory=list)
    frames: int = 0
    samples: int = 0
    offline_samples: int = 0
    max_abs: float = 0.0
    rel: float = 0.0
    tol: float = 1e-5
    flush_samples: int = 0
    problems: list[str] = field(default_factory=list)
    output: str = ""
    noise_floor: float | None = None  # offline vs itself on a causal prefix (see noise_floor)

    def format(self) -> str:
        lines = [f"stream-check {'OK' if self.ok else 'MISMATCH'}: {self.frames} frame(s) in "
                 f"{len(self.chunks)} chunk(s) -> {self.samples} sample(s) of {self.output!r} "
                 f"(offline {self.offline_samples}); max|diff| {self.max_abs:.3g}, rel "
                 f"{self.rel:.3g} (tol {self.tol:g})"]
        counts = ", ".join(f"{c.frames}->{c.emitted}" + ("" if c.emitted == c.expected else
                                                         f" (expected {c.expected})")
                           for c in self.chunks)
        lines.append(f"  per chunk (frames->samples): {counts}; flush -> {self.flush_samples}")
        if self.noise_floor is not None:
            lines.append(f"  offline noise floor (offline(n)[:k] vs offline(n-1)): "
                         f"{self.noise_floor:.3g}")
        lines.extend("  " + p for p in self.problems)
        return "\n".join(lines)


def random_frames(manifest: Mapping[str, Any], frames: int, seed: int = 0,
                  shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in manifest["inputs"]:
        shape = []
        for d, v in enumerate(i["numpy_shape"]):
            if d == i["numpy_axis"]:
                shape.append(frames)
            elif isinstance(v, int):
                shape.append(v)
            elif shapes and i["name"] in shapes:
                shape.append(int(shapes[i["name"]][d]))
            else:
                raise ParamSurgeryError(f"input {i['name']!r}: extent of axis {d} unknown; "
                                        f"give the input shape")
        feeds[i["name"]] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def stream_compare(original_param: str | os.PathLike, original_bin: str | os.PathLike | None,
                   runner: StreamingRunner, frames: Mapping[str, np.ndarray],
                   chunks: Sequence[int], *, tol: float = 1e-5,
                   offline: Mapping[str, np.ndarray] | None = None,
                   options: RunOptions | None = None) -> StreamCheck:
    """Stream `frames` through `runner` in `chunks` and compare with the original graph run
    once on all frames (`offline`, if given, is used instead)."""
    m = runner.manifest
    total = sum(chunks)
    for i in m["inputs"]:
        if frames[i["name"]].shape[i["numpy_axis"]] != total:
            raise ParamSurgeryError(f"chunks add up to {total} frames, input {i['name']!r} has "
                                    f"{frames[i['name']].shape[i['numpy_axis']]}")
    o = m["outputs"][0]
    name, ax = o["name"], o["numpy_axis"]
    if offline is None:
        net = load_net(original_param, original_bin, options)
        offline = run_net(net, frames, [oo["name"] for oo in m["outputs"]])
    runner.reset()
    pieces: dict[str, list[np.ndarray]] = {oo["name"]: [] for oo in m["outputs"]}
    report = StreamCheck(ok=True, tol=tol, frames=total, output=name)
    pos = 0
    for c in chunks:
        chunk = {k: np.take(v, np.arange(pos, pos + c), axis=_axis(m, k)) for k, v in
                 frames.items()}
        before = emitted_after(m, pos, name)
        pos += c
        got = runner.push_all(chunk)
        for k, v in got.items():
            pieces[k].append(v)
        expected = emitted_after(m, pos, name) - before
        report.chunks.append(ChunkReport(c, got[name].shape[ax], expected))
        if got[name].shape[ax] != expected:
            report.ok = False
    tail = runner.flush_all()
    for k, v in tail.items():
        pieces[k].append(v)
    report.flush_samples = tail[name].shape[ax]
    bad_counts = [i for i, c in enumerate(report.chunks) if c.emitted != c.expected]
    if bad_counts:
        report.problems.append(f"chunk(s) {', '.join(map(str, bad_counts))} emitted a count "
                               f"other than the earliest possible")
    for oo in m["outputs"]:
        k, a = oo["name"], oo["numpy_axis"]
        joined = np.concatenate(pieces[k], axis=a)
        ref = np.asarray(offline[k], np.float32)
        if k == name:
            report.samples = joined.shape[a]
            report.offline_samples = ref.shape[a] if ref.ndim else 0
        if joined.shape != ref.shape:
            report.ok = False
            report.problems.append(f"{k}: streamed shape {joined.shape} != offline {ref.shape}")
            continue
        if ref.size == 0:
            continue
        diff = float(np.max(np.abs(joined - ref)))
        scale = float(np.max(np.abs(ref))) or 1.0
        if k == name:
            report.max_abs, report.rel = diff, diff / scale
        if not np.all(np.isfinite(joined)) or diff / scale > tol:
            report.ok = False
            report.problems.append(f"{k}: max|diff| {diff:.3g} = {diff / scale:.3g} of "
                                   f"max|offline| (tol {tol:g})")
    return report


def noise_floor(param: str | os.PathLike, bin: str | os.PathLike | None,
                manifest: Mapping[str, Any], frames: Mapping[str, np.ndarray],
                options: RunOptions | None = None) -> float | None:
    """How far the offline graph disagrees with itself: max|offline(n)[:k] - offline(n-1)| /
    max|offline(n)| over the first output, where k = len(offline(n-1)). Both are the same
    samples (the stack is causal), but ncnn picks kernels and tilings by width, so fp32
    rounding differs; no chunked run can be held closer to offline than this. None when
    n-1 frames give no sample."""
    m = manifest
    o = m["outputs"][0]
    n = frames[m["inputs"][0]["name"]].shape[m["inputs"][0]["numpy_axis"]]
    if n < 2 or emitted_after({**m, "stream_start": {"buffer_frames": 0}}, n - 1) == 0:
        return None
    full = run_offline(param, bin, frames, [o["name"]], options)[o["name"]]
    short = {k: np.take(v, np.arange(n - 1), axis=_axis(m, k)) for k, v in frames.items()}
    part = run_offline(param, bin, short, [o["name"]], options)[o["name"]]
    k = part.shape[o["numpy_axis"]]
    head = np.take(full, np.arange(k), axis=o["numpy_axis"])
    scale = float(np.max(np.abs(full))) or 1.0
    return float(np.max(np.abs(head - part))) / scale


def run_offline(param: str | os.PathLike, bin: str | os.PathLike | None,
                frames: Mapping[str, np.ndarray], outputs: Sequence[str],
                options: RunOptions | None = None) -> dict[str, np.ndarray]:
    """The graph run once on all frames, in a child process: its weights are never resident
    next to the streaming nets', and only the outputs come back."""
    from paramsurgery.runtime.child import NcnnRunError, run_isolated

    res = run_isolated(param, bin, frames, list(outputs), options)
    if not res.ok:
        raise NcnnRunError(res.status, res.describe())
    return res.outputs


def _axis(m: Mapping[str, Any], name: str) -> int:
    for i in m["inputs"]:
        if i["name"] == name:
            return i["numpy_axis"]
    raise KeyError(name)


def check_stream(param: str | os.PathLike, bin: str | os.PathLike | None,
                 chunks: Sequence[int], *, seed: int = 0, tol: float = 1e-5,
                 time_axis: Any = None, shapes: Mapping[str, Sequence[int]] | None = None,
                 num_threads: int = 1, workdir: str | None = None,
                 floor: bool = False) -> tuple[StreamCheck, dict]:
    """Convert `param`/`bin` with add-conv-cache (into `workdir`, default a temporary
    directory), stream random frames in `chunks` and compare with the original offline.
    `floor`: also measure the offline noise floor (`noise_floor`)."""
    if not chunks or any(int(c) <= 0 for c in chunks):
        raise ParamSurgeryError("--chunks must be positive frame counts")
    with tempfile.TemporaryDirectory(prefix="paramsurgery-stream-") as tmp:
        out = os.path.join(workdir or tmp, Path(os.fspath(param)).name.replace(".param", "")
                           + ".stream")
        conv = convert(param, bin, out, time_axis=time_axis)
        conv.result = None  # the converted graph maps the weights: let them go before the runs
        gc.collect()
        frames = random_frames(conv.manifest, sum(chunks), seed, shapes)
        opts = RunOptions(num_threads=num_threads, pool=True)
        # the offline side first, in child processes; then the streaming nets in this one
        offline = run_offline(param, bin, frames, [o["name"] for o in conv.manifest["outputs"]],
                              opts)
        noise = noise_floor(param, bin, conv.manifest, frames, opts) if floor else None
        runner = StreamingRunner(conv.param, conv.bin, conv.manifest,
                                 start_param=conv.start_param, num_threads=num_threads,
                                 one_net=True)
        report = stream_compare(param, bin, runner, frames, [int(c) for c in chunks], tol=tol,
                                offline=offline, options=opts)
        if floor:
            report.noise_floor = noise
        return report, conv.manifest
