"""`paramsurgery reduce`: shrink a failing ncnn graph to a minimal one that still fails.

The idea is Polygraphy's `debug reduce` (bisect, then linear), on ncnn graphs:

1. **outputs side**: find the shortest prefix (layers in file order, which is topological)
   that still fails; a prefix needs no new inputs. Then keep only the cone of its last layer
   (that layer and its ancestors) if the cone still fails.
2. **inputs side**: drop layers from the front of the cone. A blob a kept layer reads whose
   producer was dropped becomes the top of a new `Input` layer (named `cut_<blob>`, with
   the blob's shape as Input params when known), fed with the value the blob had in a full
   run (see below). Bisect gallops from the failing end: 1, 2, 4, ... layers, then halves.
3. **linear**: try removing every remaining layer one at a time until no single removal
   keeps the failure (1-minimal).

`mode="linear"` replaces the halving of phases 1 and 2 by one layer at a time (slower,
robust when the failure is not monotone). Weights stay exact: a candidate is the source
graph minus layers, and every kept layer's weight blobs are copied byte for byte from the
source `.bin` (paramsurgery.weights); the result is checked against the source afterwards.

What "fails" means is a check:
- `CommandCheck`: a shell-free command template, `{param}` `{bin}` `{inputs}` `{expected}`
  `{dir}` substituted; it fails when its exit code is non-zero (or one of `fail_codes`,
  negative = killed by that signal) and, if given, its output matches `fail_regex`;
- `PredicateCheck`: a Python function `fn(candidate) -> bool` (True = still fails);
- `BuiltinCheck`: the graph run through ncnn in a child process; kind `crash` (killed by
  the same signal as the original), `load-error` (load_param/load_model fails), `mismatch`
  (an output differs from the same blob of a reference graph) or `any`.

Values for cut inputs: the graph's own inputs come from `--inputs` (npz: blob name ->
array, `batch_index_<blob>` optional, the repro fixtures' ref.npz works as is); every
other blob's value is harvested once by running the reference graph (mismatch) or the
source graph itself in a child process that extracts every blob in file order and saves
each one as it goes, so a crash keeps everything computed before it (and tells which
layer crashed, a head start for phase 1).

The replay log (replay.json) records every candidate tried (kept layers, verdict, detail,
seconds) keyed by the sha256 of its .param; `replay=` reuses recorded verdicts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from paramsurgery.errors import ParamSurgeryError
from paramsurgery.graph import Graph
from paramsurgery.io import atomic_open, atomic_write, load
from paramsurgery.runtime import (NO_BATCH, Feed, Fetch, RunOptions, RunResult, child_env,
                                  run_isolated)

FAIL, PASS, OTHER, UNKNOWN = "fail", "pass", "other", "unknown"
KINDS = ("crash", "load-error", "mismatch", "any")


# =========================================================================== values

def _ncnn_shape(arr: np.ndarray, batch_index: int) -> tuple[int, ...]:
    shape = list(arr.shape)
    if batch_index != NO_BATCH and 0 <= batch_index < len(shape):
        del shape[batch_index]
    return tuple(shape)


class ValueStore:
    """Known blob values: blob -> (array, batch_index)."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[np.ndarray, int]] = {}

    def __contains__(self, blob: str) -> bool:
        return blob in self.values

    def __len__(self) -> int:
        return len(self.values)

    def get(self, blob: str) -> tuple[np.ndarray, int] | None:
        return self.values.get(blob)

    def put(self, blob: str, arr: np.ndarray, batch_index: int = NO_BATCH) -> None:
        self.values[blob] = (arr, batch_index)

    def feed(self, blob: str) -> Feed | None:
        v = self.values.get(blob)
        return None if v is None else Feed(v[0], v[1])

    def input_params(self, blob: str) -> dict[int, int] | None:
        """ncnn `Input` params (0=w 1=h 11=d 2=c) for a blob of known shape."""
        v = self.values.get(blob)
        if v is None:
            return None
        shape = _ncnn_shape(*v)
        if not 1 <= len(shape) <= 4:
            return None
        keys = {1: (0,), 2: (1, 0), 3: (2, 1, 0), 4: (2, 11, 1, 0)}[len(shape)]
        return {k: int(d) for k, d in zip(keys, shape)}

    @classmethod
    def from_npz(cls, path: str | os.PathLike, names: Iterable[str] | None = None) -> "ValueStore":
        """Blob values from an npz: keys are blob names, `batch_index_<blob>` optional.
        With `names`, only those keys are taken (e.g. a ref.npz's in0 but not its out0)."""
        store = cls()
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ParamSurgeryError(f"cannot read inputs: {exc}", file=os.fspath(path)) from None
        with z:
            keys = set(z.files)
            want = set(names) if names is not None else {k for k in keys
                                                          if not k.startswith("batch_index_")}
            for k in sorted(keys & want):
                bi = int(z[f"batch_index_{k}"]) if f"batch_index_{k}" in keys else NO_BATCH
                store.put(k, np.asarray(z[k]), bi)
        return store

    def save_npz(self, path: Any, blobs: Iterable[str]) -> list[str]:
        """Write the values of `blobs` (those known) in the from_npz layout to a path or a
        binary file object; returns the blobs written."""
        arrays: dict[str, np.ndarray] = {}
        done = []
        for b in blobs:
            v = self.values.get(b)
            if v is None:
                continue
            arrays[b] = v[0]
            if v[1] != NO_BATCH:
                arrays[f"batch_index_{b}"] = np.array(v[1], dtype=np.int32)
            done.append(b)
        if hasattr(path, "write"):
            np.savez(path, **arrays)
        else:
            with open(path, "wb") as fh:
                np.savez(fh, **arrays)
        return done


@dataclass
class Harvest:
    """The outcome of running a graph once and extracting every blob."""

    status: str                       # ok | crash | load_fail | error | timeout
    extracted: int = 0
    stopped_at: str | None = None     # the blob whose extraction did not come back
    signal: int | None = None
    message: str = ""
    seconds: float = 0.0


def harvest(param: str | os.PathLike, bin: str | os.PathLike | None, feeds: ValueStore,
            blobs: Sequence[str], store: ValueStore, *, timeout: float = 600.0) -> Harvest:
    """Run the graph in a child process, extract `blobs` in order (light mode off, so each
    extract computes one more layer) and put every value that came back into `store`."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="paramsurgery-harvest-") as tmp:
        d = Path(tmp)
        inputs = [b for b in feeds.values]
        feeds.save_npz(d / "inputs.npz", inputs)
        (d / "spec.json").write_text(json.dumps({
            "param": os.fspath(param), "bin": None if bin is None else os.fspath(bin),
            "inputs": inputs, "blobs": list(blobs)}))
        try:
            proc = subprocess.run([sys.executable, "-m", "paramsurgery.repro.reduce",
                                   "--harvest-child", str(d)], capture_output=True, text=True,
                                  timeout=timeout, errors="replace", env=child_env())
            rc, err = proc.returncode, proc.stderr
            status = "ok" if rc == 0 else ("crash" if rc < 0 else "error")
        except subprocess.TimeoutExpired:
            rc, err, status = None, "", "timeout"
        n = 0
        index = d / "index.tsv"
        if index.exists():
            for line in index.read_text().splitlines():
                parts = line.split("\t")
                if len(parts) != 3:
                    continue            # a line cut by the crash
                i, blob, bi = parts
                f = d / f"{i}.npy"
                if blob in store:       # keep given values (inputs) as they were fed
                    continue
                try:
                    store.put(blob, np.load(f, allow_pickle=False), int(bi))
                    n += 1
                except (OSError, ValueError):
                    pass
        stopped = None
        cur = d / "current.txt"
        if status != "ok" and cur.exists():
            stopped = cur.read_text().strip() or None
        loadf = d / "load_failed.txt"
        message = ""
        if loadf.exists():
            status = "load_fail"
            message = loadf.read_text().strip()
        elif status != "ok":
            message = "\n".join([ln for ln in err.splitlines() if ln.strip()][-5:])
    return Harvest(status, n, stopped, -rc if rc is not None and rc < 0 else None, message,
                   time.monotonic() - t0)


def _harvest_child(d: Path) -> int:
    from paramsurgery.runtime import NcnnRunError, RunOptions, _to_mat, load_net

    spec = json.loads((d / "spec.json").read_text())
    try:
        net = load_net(spec["param"], spec["bin"], RunOptions(light_mode=False))
    except NcnnRunError as exc:
        (d / "load_failed.txt").write_text(f"{exc.status}: {exc.message}")
        return 0
    with np.load(d / "inputs.npz") as z:
        keys = set(z.files)
        mats = {}
        for name in spec["inputs"]:
            bi = int(z[f"batch_index_{name}"]) if f"batch_index_{name}" in keys else NO_BATCH
            mats[name] = _to_mat(Feed(z[name], bi))
    ex = net.create_extractor()
    ex.set_light_mode(False)
    for name, mat in mats.items():
        ex.input(name, mat)
    with open(d / "index.tsv", "w") as index, open(d / "current.txt", "w") as cur:
        for i, blob in enumerate(spec["blobs"]):
            cur.seek(0)
            cur.write(blob + "\n")
            cur.truncate()
            cur.flush()
            ret, mat = ex.extract(blob)
            if ret != 0 or mat.dims == 0:
                continue
            if getattr(mat, "n", 1) > 1:
                arr, bi = np.array(mat.numpy(batch_index=0), copy=True), 0
            else:
                arr, bi = np.array(mat, copy=True), NO_BATCH
            np.save(d / f"{i}.npy", arr)
            index.write(f"{i}\t{blob}\t{bi}\n")
            index.flush()
    return 0


# =========================================================================== candidates

@dataclass
class Candidate:
    """One graph tried during the reduction. Files live in a scratch directory until the
    next candidate is built: copy what you need inside a predicate."""

    keep: tuple[int, ...]             # kept layer positions (non-Input layers of the source)
    graph: Graph
    param: Path
    bin: Path | None
    inputs: list[str]                 # the candidate's graph inputs (Input tops)
    outputs: list[str]                # blobs nobody reads (what ncnn can extract)
    cut: list[str]                    # inputs that are cut blobs (new Input layers)
    feeds: dict[str, Feed]            # known values of `inputs`
    missing: list[str]                # inputs without a known value
    expected: dict[str, np.ndarray]   # reference values of `outputs`, when known
    reference: "ValueStore | None"    # reference values of every blob (mismatch checks)
    inputs_npz: Path
    expected_npz: Path
    key: str                          # sha256 of the .param text

    @property
    def layers(self) -> int:
        """Layers other than Input."""
        return len(self.keep)

    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.graph if layer.type != "Input"]


@dataclass
class Verdict:
    result: str                       # fail | pass | other | unknown
    detail: str = ""
    signal: int | None = None         # the signal that killed ncnn, for crashes

    @property
    def failed(self) -> bool:
        return self.result == FAIL


class Builder:
    """Makes candidate graphs out of a source graph (weights attached or not)."""

    def __init__(self, graph: Graph, values: ValueStore, expected: ValueStore | None,
                 workdir: Path, has_bin: bool) -> None:
        self.graph = graph
        self.values = values
        self.expected = expected
        self.workdir = workdir
        self.has_bin = has_bin
        self.layers = list(graph)
        self.universe = [i for i, layer in enumerate(self.layers) if layer.type != "Input"]
        self.pos = {layer.id: i for i, layer in enumerate(self.layers)}
        self._n = 0

    def producer_pos(self, blob: str) -> int | None:
        p = self.graph.producer(blob)
        return None if p is None else self.pos[p.id]

    def cone(self, sink: int, within: Iterable[int]) -> list[int]:
        """`sink` and its ancestors among `within`, in file order (iterative)."""
        allowed = set(within)
        seen = {sink}
        work = [sink]
        while work:
            i = work.pop()
            for b in self.layers[i].inputs:
                p = self.producer_pos(b)
                if p is not None and p in allowed and p not in seen and \
                        self.layers[p].type != "Input":
                    seen.add(p)
                    work.append(p)
        return sorted(seen)

    def subgraph(self, keep: Iterable[int]) -> tuple[Graph, list[str]]:
        """The source graph with only `keep` (positions of non-Input layers); returns the
        graph and the cut blobs that became new Inputs."""
        keep_set = set(keep)
        g = self.graph.copy()
        copies = list(g)
        for i, layer in enumerate(copies):
            if layer.type != "Input" and i not in keep_set:
                g.remove_layer(layer)
        for layer in g.by_type("Input"):
            if not any(g.consumers(b) for b in layer.outputs):
                g.remove_layer(layer)
        cut: list[str] = []
        for layer in g:
            for b in layer.inputs:
                if g.producer(b) is None and b not in cut and \
                        self.graph.producer(b) is not None:
                    cut.append(b)
        anchor = next(iter(g), None)
        for b in cut:
            name = g.unique_layer_name(f"cut_{b}")
            g.add_layer("Input", name, [], [b], self.values.input_params(b), before=anchor)
        g.mark_modified()
        return g, cut

    def build(self, keep: Iterable[int]) -> Candidate:
        keep_t = tuple(sorted(set(keep)))
        g, cut = self.subgraph(keep_t)
        self._n += 1
        d = self.workdir / "candidate"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        param = d / "model.param"
        binp = d / "model.bin" if self.has_bin else None
        data = g.dump_bytes()
        if binp is not None:
            g.save(param, binp)
        else:
            param.write_bytes(data)
        inputs = g.inputs
        outputs = g.outputs
        feeds: dict[str, Feed] = {}
        missing = []
        for b in inputs:
            f = self.values.feed(b)
            if f is None:
                missing.append(b)
            else:
                feeds[b] = f
        expected: dict[str, np.ndarray] = {}
        exp_store = self.expected
        if exp_store is not None:
            for b in outputs:
                v = exp_store.get(b)
                if v is not None:
                    expected[b] = v[0]
        self.values.save_npz(d / "inputs.npz", inputs)
        if exp_store is not None:
            exp_store.save_npz(d / "expected.npz", outputs)
        else:
            np.savez(d / "expected.npz")
        return Candidate(keep_t, g, param, binp, inputs, outputs, cut, feeds, missing,
                         expected, exp_store, d / "inputs.npz", d / "expected.npz",
                         hashlib.sha256(data).hexdigest())


# =========================================================================== checks

def _squeezed(shape: Sequence[int]) -> list[int]:
    return [d for d in shape if d != 1]


def compare_values(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> str | None:
    """None when equal within tolerance (unit axes ignored); else what differs."""
    got = np.asarray(got)
    want = np.asarray(want)
    if _squeezed(got.shape) != _squeezed(want.shape) or got.size != want.size:
        return f"shape {list(got.shape)} vs reference {list(want.shape)}"
    if got.size == 0:
        return None
    g = got.reshape(want.shape).astype(np.float64)
    w = want.astype(np.float64)
    if np.allclose(g, w, atol=atol, rtol=rtol, equal_nan=True):
        return None
    finite = np.isfinite(g) & np.isfinite(w)
    err = float(np.max(np.where(finite, np.abs(g - w), np.inf)))
    return f"max abs error {err:.3g}"


class Check:
    """Decides whether a candidate still fails. `describe()` goes into the replay log."""

    needs_values = False

    def __call__(self, cand: Candidate) -> Verdict:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError

    def calibrate(self, verdict: Verdict) -> None:
        """Called with the source graph's verdict (lets a check pin the failure kind)."""


class CommandCheck(Check):
    def __init__(self, template: str, *, fail_codes: Sequence[int] = (),
                 fail_regex: str | None = None, timeout: float = 600.0) -> None:
        try:
            self.argv = shlex.split(template)
        except ValueError as exc:
            raise ParamSurgeryError(f"--check: {exc}") from None
        if not self.argv:
            raise ParamSurgeryError("--check: empty command")
        self.template = template
        self.fail_codes = set(fail_codes)
        self.fail_regex = re.compile(fail_regex) if fail_regex else None
        self.timeout = timeout

    def describe(self) -> dict[str, Any]:
        return {"check": "command", "command": self.template,
                "fail_codes": sorted(self.fail_codes) or "any non-zero",
                "fail_regex": self.fail_regex.pattern if self.fail_regex else None}

    def __call__(self, cand: Candidate) -> Verdict:
        subst = {"param": str(cand.param), "bin": str(cand.bin) if cand.bin else "",
                 "inputs": str(cand.inputs_npz), "expected": str(cand.expected_npz),
                 "dir": str(cand.param.parent)}
        argv = [_substitute(a, subst) for a in self.argv]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                  timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return Verdict(OTHER, f"no exit after {self.timeout:.0f} s")
        except OSError as exc:
            raise ParamSurgeryError(f"--check: cannot run {argv[0]!r}: {exc.strerror or exc}") \
                from None
        rc = proc.returncode
        out = proc.stdout + proc.stderr
        tail = " | ".join([ln.strip() for ln in out.splitlines() if ln.strip()][-2:])
        code = _describe_rc(rc)
        failed = rc in self.fail_codes if self.fail_codes else rc != 0
        if failed and self.fail_regex is not None and not self.fail_regex.search(out):
            return Verdict(OTHER, f"{code}, output does not match --fail-regex: {tail}")
        if failed:
            return Verdict(FAIL, f"{code}" + (f": {tail}" if tail else ""))
        if rc != 0:
            return Verdict(OTHER, f"{code} (not a --fail-code)" + (f": {tail}" if tail else ""))
        return Verdict(PASS, code)


def _substitute(arg: str, subst: dict[str, str]) -> str:
    return re.sub(r"\{(param|bin|inputs|expected|dir)\}", lambda m: subst[m.group(1)], arg)


def _describe_rc(rc: int) -> str:
    if rc < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


class PredicateCheck(Check):
    def __init__(self, fn: Callable[[Candidate], Any], name: str) -> None:
        self.fn = fn
        self.name = name

    def describe(self) -> dict[str, Any]:
        return {"check": "predicate", "predicate": self.name}

    def __call__(self, cand: Candidate) -> Verdict:
        try:
            res = self.fn(cand)
        except Exception as exc:  # noqa: BLE001 - the user's code
            raise ParamSurgeryError(f"--predicate {self.name} raised {type(exc).__name__}: "
                                    f"{exc}") from exc
        if isinstance(res, Verdict):
            return res
        if isinstance(res, tuple) and len(res) == 2:
            return Verdict(FAIL if res[0] else PASS, str(res[1]))
        return Verdict(FAIL if res else PASS, "")


def load_predicate(spec: str) -> PredicateCheck:
    """`module:function` or `path/to/file.py:function`."""
    mod_name, sep, fn_name = spec.rpartition(":")
    if not sep or not mod_name or not fn_name:
        raise ParamSurgeryError(f"--predicate {spec!r}: expected module:function")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            path = Path(mod_name)
            if not path.is_file():
                raise ParamSurgeryError("no such file", file=mod_name)
            sp = importlib.util.spec_from_file_location(f"_paramsurgery_predicate_{path.stem}",
                                                        path)
            module = importlib.util.module_from_spec(sp)  # type: ignore[arg-type]
            sp.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(mod_name)
    except ParamSurgeryError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ParamSurgeryError(f"--predicate {spec!r}: cannot import {mod_name}: "
                                f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ParamSurgeryError(f"--predicate {spec!r}: {mod_name} has no function {fn_name!r}")
    return PredicateCheck(fn, spec)


class BuiltinCheck(Check):
    """Run the candidate through ncnn in a child process and classify what happened."""

    def __init__(self, kind: str, *, atol: float = 1e-3, rtol: float = 1e-3,
                 timeout: float = 600.0, fail_regex: str | None = None,
                 same_signal: bool = True, compare: str = "outputs") -> None:
        if kind not in KINDS:
            raise ParamSurgeryError(f"unknown failure kind {kind!r} (one of {', '.join(KINDS)})")
        if compare not in ("outputs", "all"):
            raise ParamSurgeryError(f"unknown compare mode {compare!r} (outputs or all)")
        self.kind = kind
        self.compare = compare
        self.atol = atol
        self.rtol = rtol
        self.timeout = timeout
        self.fail_regex = re.compile(fail_regex) if fail_regex else None
        self.same_signal = same_signal
        self.signal: int | None = None
        self.needs_values = kind != "load-error"

    def describe(self) -> dict[str, Any]:
        return {"check": "builtin", "kind": self.kind, "compare": self.compare,
                "atol": self.atol, "rtol": self.rtol, "signal": self.signal,
                "fail_regex": self.fail_regex.pattern if self.fail_regex else None}

    def calibrate(self, verdict: Verdict) -> None:
        if verdict.failed and verdict.signal is not None:
            self.signal = verdict.signal

    def compared(self, cand: Candidate) -> dict[str, np.ndarray]:
        """Blob -> reference value for the blobs this check compares."""
        if self.compare == "outputs" or cand.reference is None:
            return dict(cand.expected)
        out: dict[str, np.ndarray] = {}
        for layer in cand.graph:
            if layer.type == "Input":
                continue
            for b in layer.outputs:
                v = cand.reference.get(b)
                if v is not None:
                    out[b] = v[0]
        return out

    def _run(self, cand: Candidate, load_only: bool, blobs: Sequence[str]) -> RunResult:
        if load_only:
            return run_isolated(cand.param, cand.bin, {}, [], timeout=self.timeout)
        if not blobs or set(blobs) <= set(cand.outputs):
            fetches = [Fetch(b) for b in cand.outputs]
            return run_isolated(cand.param, cand.bin, cand.feeds, fetches, timeout=self.timeout)
        # intermediate blobs too: in file order with light mode off (ncnn 1.0.20261020
        # segfaults when a blob its light mode already released is extracted afterwards)
        wanted = set(blobs) | set(cand.outputs)
        order = [b for b in cand.graph.blob_names() if b in wanted]
        return run_isolated(cand.param, cand.bin, cand.feeds, [Fetch(b) for b in order],
                            options=RunOptions(light_mode=False), timeout=self.timeout)

    def __call__(self, cand: Candidate) -> Verdict:
        load_only = self.kind == "load-error"
        if not load_only and cand.missing:
            return Verdict(UNKNOWN, "no value for input(s) " + ", ".join(cand.missing[:5]))
        expected = self.compared(cand) if self.kind in ("mismatch", "any") else {}
        if self.kind == "mismatch" and not expected:
            return Verdict(UNKNOWN, "no reference value for any compared blob")
        run = self._run(cand, load_only, list(expected))
        text = run.message + "\n" + run.stderr
        verdict = self._classify(run, expected)
        if verdict.failed and self.fail_regex is not None and not self.fail_regex.search(text):
            return Verdict(OTHER, verdict.detail + " (does not match --fail-regex)")
        return verdict

    def _classify(self, run: RunResult, expected: dict[str, np.ndarray]) -> Verdict:
        st = run.status
        msg = (run.message or "").strip().splitlines()
        err = [ln.strip() for ln in run.stderr.splitlines() if ln.strip()]
        first = (err[0] if err else (msg[0] if msg else ""))
        if st == "crash":
            desc = f"ncnn {run.describe()}"
            if self.kind in ("crash", "any"):
                if self.kind == "crash" and self.same_signal and self.signal is not None \
                        and run.signal != self.signal:
                    return Verdict(OTHER, desc + f", not signal {self.signal}", run.signal)
                return Verdict(FAIL, desc, run.signal)
            return Verdict(OTHER, desc, run.signal)
        if st in ("load_param_failed", "load_model_failed"):
            desc = f"{st}: {first}" if first else st
            return Verdict(FAIL if self.kind in ("load-error", "any") else OTHER, desc)
        if self.kind == "load-error":
            return Verdict(PASS, "loads")
        if st == "ok":
            if self.kind in ("mismatch", "any") and expected:
                diffs = []
                for b, want in expected.items():
                    got = run.outputs.get(b)
                    if got is None:
                        continue
                    d = compare_values(got, want, self.atol, self.rtol)
                    if d is not None:
                        diffs.append(f"{b}: {d}")
                if diffs:
                    return Verdict(FAIL, "mismatch: " + "; ".join(diffs[:3]) +
                                   (f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""))
                what = "output" if self.compare == "outputs" else "blob"
                return Verdict(PASS, f"{len(expected)} {what}(s) match the reference")
            return Verdict(PASS, "runs")
        if st in ("input_failed", "error"):
            return Verdict(OTHER, f"{st}: {first}")
        if st == "timeout":
            return Verdict(OTHER, run.describe())
        # extract_failed: the graph loads but an output cannot be computed
        return Verdict(FAIL if self.kind == "any" else OTHER, f"{st}: {first}")



# =========================================================================== reducer

@dataclass
class Step:
    n: int
    phase: str
    layers: int
    kept: str                         # kept layer positions, e.g. "1,3,6-851"
    result: str
    detail: str
    seconds: float
    key: str
    replayed: bool = False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ranges(keep: Sequence[int]) -> str:
    """Positions (0-based, in file order, Input layers counted) as "1,3,6-851"."""
    out: list[list[int]] = []
    for i in keep:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


@dataclass
class ReduceResult:
    source_layers: int
    failing: Candidate
    failing_verdict: Verdict
    passing: Candidate | None
    passing_verdict: Verdict | None
    steps: list[Step]
    seconds: float
    runs: int
    harvest: Harvest | None = None
    notes: list[str] = field(default_factory=list)


class Reducer:
    def __init__(self, graph: Graph, check: Check, *, values: ValueStore | None = None,
                 expected: ValueStore | None = None, mode: str = "bisect",
                 workdir: Path, has_bin: bool = False,
                 replay: dict[str, dict[str, Any]] | None = None,
                 progress: Callable[[Step], None] | None = None,
                 hint_blob: str | None = None) -> None:
        if mode not in ("bisect", "linear"):
            raise ParamSurgeryError(f"unknown mode {mode!r} (bisect or linear)")
        self.check = check
        self.mode = mode
        self.builder = Builder(graph, values or ValueStore(), expected, workdir, has_bin)
        self.steps: list[Step] = []
        self.cache: dict[tuple[int, ...], Verdict] = {}
        self.replay = replay or {}
        self.progress = progress
        self.runs = 0
        self.best_pass: tuple[int, tuple[int, ...]] | None = None
        self.hint_blob = hint_blob

    # ------------------------------------------------------------------ evaluation
    def test(self, keep: Iterable[int], phase: str) -> Verdict:
        keep_t = tuple(sorted(set(keep)))
        if keep_t in self.cache:
            return self.cache[keep_t]
        if not keep_t:
            v = Verdict(PASS, "empty graph")
            self.cache[keep_t] = v
            return v
        t0 = time.monotonic()
        cand = self.builder.build(keep_t)
        rec = self.replay.get(cand.key)
        if rec is not None:
            v = Verdict(rec["result"], rec["detail"])
            replayed = True
        else:
            v = self.check(cand)
            self.runs += 1
            replayed = False
        step = Step(len(self.steps) + 1, phase, len(keep_t), _ranges(keep_t), v.result,
                    v.detail, round(time.monotonic() - t0, 3), cand.key, replayed)
        self.steps.append(step)
        if self.progress is not None:
            self.progress(step)
        self.cache[keep_t] = v
        if v.result == PASS and (self.best_pass is None or len(keep_t) >= self.best_pass[0]):
            self.best_pass = (len(keep_t), keep_t)
        return v

    def fails(self, keep: Iterable[int], phase: str) -> bool:
        return self.test(keep, phase).failed

    # ------------------------------------------------------------------ phases
    def _outputs_side(self, universe: list[int]) -> int:
        """Smallest k such that universe[:k] fails (universe[:n] is known to fail)."""
        n = len(universe)
        if self.mode == "linear":
            k = n
            while k > 1 and self.fails(universe[:k - 1], "outputs-linear"):
                k -= 1
            return k
        lo, hi = 0, n
        hint = self._hint_index(universe)
        if hint is not None and 0 < hint + 1 < n:
            if self.fails(universe[:hint + 1], "outputs-hint"):
                hi = hint + 1
                if self.fails(universe[:hint], "outputs-hint"):
                    hi = hint
                else:
                    lo = hint
            else:
                lo = hint + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fails(universe[:mid], "outputs-bisect"):
                hi = mid
            else:
                lo = mid
        return hi

    def _hint_index(self, universe: list[int]) -> int | None:
        if self.hint_blob is None:
            return None
        p = self.builder.producer_pos(self.hint_blob)
        if p is None or p not in universe:
            return None
        return universe.index(p)

    def _inputs_side(self, cone: list[int]) -> list[int]:
        """Shortest failing suffix of `cone` (the whole cone is known to fail)."""
        n = len(cone)
        if n <= 1:
            return cone
        if self.mode == "linear":
            j = 0
            while j < n - 1 and self.fails(cone[j + 1:], "inputs-linear"):
                j += 1
            return cone[j:]
        # gallop from the failing end: suffix sizes 1, 2, 4, ... then halve
        lo, hi = 0, n               # suffix of size lo passes (0 = empty), size hi fails
        size = 1
        while size < n:
            if self.fails(cone[n - size:], "inputs-bisect"):
                hi = size
                break
            lo = size
            size *= 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fails(cone[n - mid:], "inputs-bisect"):
                hi = mid
            else:
                lo = mid
        return cone[n - hi:]

    def _linear(self, keep: list[int]) -> list[int]:
        """Remove single layers while the failure stays, until none can go (1-minimal)."""
        current = list(keep)
        changed = True
        while changed and len(current) > 1:
            changed = False
            for x in list(current):
                trial = [i for i in current if i != x]
                if trial and self.fails(trial, "linear"):
                    current = trial
                    changed = True
        return current

    # ------------------------------------------------------------------ driver
    def run(self) -> ReduceResult:
        t0 = time.monotonic()
        b = self.builder
        universe = b.universe
        if not universe:
            raise ParamSurgeryError("the graph has no layers besides Input")
        v0 = self.test(universe, "source")
        if not v0.failed:
            raise SourcePasses(v0)
        self.check.calibrate(v0)
        k = self._outputs_side(universe)
        prefix = universe[:k]
        sink = prefix[-1]
        cone = b.cone(sink, prefix)
        current = cone if len(cone) == len(prefix) or self.fails(cone, "cone") else prefix
        current = self._inputs_side(current)
        current = self._linear(current)
        fail_v = self.test(current, "result")     # known: every accepted step failed
        failing = b.build(current)
        passing = passing_v = None
        if self.best_pass is not None:
            keep_p = self.best_pass[1]
            passing = b.build(keep_p)
            passing_v = self.cache[keep_p]
        return ReduceResult(len(universe), failing, fail_v, passing, passing_v, self.steps,
                            time.monotonic() - t0, self.runs)


class SourcePasses(ParamSurgeryError):
    """The source graph does not fail the check: there is nothing to reduce."""

    exit_code = 1

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(f"the source graph does not fail the check ({verdict.result}: "
                         f"{verdict.detail or 'no detail'}); nothing to reduce")
        self.verdict = verdict


# =========================================================================== top level

@dataclass
class ReduceOutput:
    result: ReduceResult
    files: dict[str, Path]
    weights_checked: int | None       # layers whose weights were compared with the source


def _input_names(g: Graph) -> list[str]:
    return list(g.inputs)


def reduce_graph(param: str | os.PathLike, bin: str | os.PathLike | None, check: Check, *,
                 out_dir: str | os.PathLike, inputs: str | os.PathLike | None = None,
                 reference: str | os.PathLike | None = None,
                 reference_bin: str | os.PathLike | None = None, mode: str = "bisect",
                 replay: str | os.PathLike | None = None, timeout: float = 600.0,
                 progress: Callable[[Step], None] | None = None,
                 note: Callable[[str], None] | None = None) -> ReduceOutput:
    """Load, gather values, reduce, write `out_dir`/{reduced,passing}.{param,bin,inputs.npz}
    and replay.json (every file atomically), and check the reduced weights byte for byte."""
    say = note or (lambda _msg: None)
    param = os.fspath(param)
    graph = load(param, bin)
    has_bin = bin is not None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    kind = getattr(check, "kind", None)
    if kind == "mismatch" and reference is None:
        raise ParamSurgeryError("--fails mismatch needs --reference REF.param (the graph "
                                "whose blob values are right)")
    values = ValueStore()
    if inputs is not None:
        values = ValueStore.from_npz(inputs, _input_names(graph))
        missing = [b for b in graph.inputs if b not in values]
        if missing:
            raise ParamSurgeryError(f"no value for graph input(s) {', '.join(missing)} "
                                    f"(keys of the npz are blob names)", file=os.fspath(inputs))
    elif getattr(check, "needs_values", False):
        values = _random_inputs(graph)
        if values is None:
            raise ParamSurgeryError("running the graph needs input values: give --inputs "
                                    "inputs.npz (keys = input blob names, optional "
                                    "batch_index_<blob>), or put shapes in the Input layers")
        say(f"inputs: random, from the Input layers' shapes ({', '.join(graph.inputs)})")

    expected: ValueStore | None = None
    harvest_info: Harvest | None = None
    hint = None
    if len(values):
        blobs = graph.blob_names()
        if reference is not None:
            ref_graph = load(reference)
            ref_values = ValueStore()
            ref_values.values.update({b: values.values[b] for b in ref_graph.inputs
                                      if b in values})
            h = harvest(reference, reference_bin, ref_values, ref_graph.blob_names(),
                        ref_values, timeout=timeout)
            if h.status != "ok":
                raise ParamSurgeryError(f"the reference graph does not run ({h.status}: "
                                        f"{h.message})", file=os.fspath(reference))
            say(f"reference: {h.extracted} blob values in {h.seconds:.1f} s")
            expected = ref_values
            # the source's own values locate the first differing blob (a head start)
            own = ValueStore()
            own.values.update(values.values)
            hs = harvest(param, bin, own, blobs, own, timeout=timeout)
            hint = _first_difference(blobs, own, ref_values, getattr(check, "atol", 1e-3),
                                     getattr(check, "rtol", 1e-3))
            if hint is None and hs.stopped_at is not None:
                hint = hs.stopped_at
            cut_values = ValueStore()
            cut_values.values.update(ref_values.values)
            harvest_info = h
            values = cut_values
        else:
            h = harvest(param, bin, values, blobs, values, timeout=timeout)
            harvest_info = h
            hint = h.stopped_at
            say(f"values: {h.extracted} blobs from one run of the source ({h.status}"
                + (f", stopped at blob {h.stopped_at}" if h.stopped_at else "")
                + f", {h.seconds:.1f} s)")

    replay_map: dict[str, dict[str, Any]] = {}
    if replay is not None:
        try:
            rec = json.loads(Path(replay).read_text())
            replay_map = {s["key"]: s for s in rec.get("steps", []) if "key" in s}
        except (OSError, ValueError, TypeError) as exc:
            raise ParamSurgeryError(f"cannot read the replay log: {exc}",
                                    file=os.fspath(replay)) from None

    work = Path(tempfile.mkdtemp(prefix="paramsurgery-reduce-"))
    try:
        reducer = Reducer(graph, check, values=values, expected=expected, mode=mode,
                          workdir=work, has_bin=has_bin, replay=replay_map,
                          progress=progress, hint_blob=hint)
        try:
            result = reducer.run()
        except SourcePasses:
            _write_replay(out / "replay.json", param, bin, check, mode, reducer, None)
            raise
        result.harvest = harvest_info
        files = _write_outputs(out, result, values, expected, has_bin)
        checked = _verify_weights(graph, files) if has_bin else None
        _write_replay(out / "replay.json", param, bin, check, mode, reducer, result,
                      checked=checked)
        files["replay"] = out / "replay.json"
        return ReduceOutput(result, files, checked)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _first_difference(blobs: Sequence[str], own: ValueStore, ref: ValueStore, atol: float,
                      rtol: float) -> str | None:
    for b in blobs:
        a, r = own.get(b), ref.get(b)
        if a is None or r is None:
            continue
        if compare_values(a[0], r[0], atol, rtol) is not None:
            return b
    return None


def _random_inputs(graph: Graph) -> ValueStore | None:
    """Random normal inputs from the Input layers' shape params (0=w 1=h 11=d 2=c)."""
    rng = np.random.default_rng(0)
    store = ValueStore()
    for layer in graph.by_type("Input"):
        p = layer.params
        dims = [int(p.get(k, 0) or 0) for k in (2, 11, 1, 0)]
        shape = tuple(d for d in dims if d > 0)
        if not shape:
            return None
        for b in layer.outputs:
            store.put(b, rng.standard_normal(shape).astype(np.float32))
    return store


def _write_outputs(out: Path, result: ReduceResult, values: ValueStore,
                   expected: ValueStore | None, has_bin: bool) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for tag, cand in (("reduced", result.failing), ("passing", result.passing)):
        paramp = out / f"{tag}.param"
        binp = out / f"{tag}.bin"
        npz = out / f"{tag}.inputs.npz"
        if cand is None:
            for p in (paramp, binp, npz):
                p.unlink(missing_ok=True)     # stale files of an earlier run would mislead
            continue
        if has_bin:
            cand.graph.save(paramp, binp)
            files[f"{tag}_bin"] = binp
        else:
            atomic_write(paramp, cand.graph.dump_bytes())
            binp.unlink(missing_ok=True)
        files[f"{tag}_param"] = paramp
        with atomic_open(npz) as fh:
            values.save_npz(fh, cand.inputs)
        files[f"{tag}_inputs"] = npz
    return files


def _verify_weights(source: Graph, files: dict[str, Path]) -> int:
    """Load every written graph with its .bin and compare each layer's weight bytes with the
    source's layer of the same name; raises if any differs."""
    src = {layer.name: layer for layer in source}
    checked = 0
    for tag in ("reduced", "passing"):
        p, bp = files.get(f"{tag}_param"), files.get(f"{tag}_bin")
        if p is None or bp is None:
            continue
        g = load(p, bp)
        for layer in g:
            if layer.type == "Input" and layer.name not in src:
                continue
            orig = src.get(layer.name)
            a, b = layer.weights, orig.weights if orig is not None else None
            if (a is None or not len(a)) and (b is None or not len(b)):
                continue
            if a is None or b is None or a.sha256 != b.sha256:
                raise ParamSurgeryError(f"{tag}.bin: weights of layer {layer.name!r} differ "
                                        f"from the source", file=os.fspath(bp))
            checked += 1
    return checked


def _write_replay(path: Path, param: str, bin: Any, check: Check, mode: str,
                  reducer: Reducer, result: ReduceResult | None, *,
                  checked: int | None = None) -> None:
    from paramsurgery import __version__

    doc: dict[str, Any] = {
        "tool": f"paramsurgery {__version__} reduce", "model": param,
        "bin": None if bin is None else os.fspath(bin), "mode": mode,
        "check": check.describe(), "runs": reducer.runs,
        "steps": [s.to_json() for s in reducer.steps],
    }
    if result is not None:
        names = result.failing.layer_names()
        doc["result"] = {
            "source_layers": result.source_layers,
            "reduced_layers": result.failing.layers, "reduced_layer_names": names,
            "reduced_verdict": result.failing_verdict.detail,
            "passing_layers": result.passing.layers if result.passing else None,
            "passing_verdict": result.passing_verdict.detail if result.passing_verdict else None,
            "seconds": round(result.seconds, 2), "weights_layers_checked": checked,
        }
        if result.harvest is not None:
            doc["result"]["harvest"] = dataclasses.asdict(result.harvest)
    atomic_write(path, json.dumps(doc, indent=2) + "\n")


def main(argv: list[str]) -> int:  # pragma: no cover - child entry point
    if len(argv) == 2 and argv[0] == "--harvest-child":
        return _harvest_child(Path(argv[1]))
    print("usage: python -m paramsurgery.repro.reduce --harvest-child DIR (internal)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
