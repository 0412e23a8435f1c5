"""The reduction itself (outputs side, inputs side, linear) and `reduce_graph`, which
harvests the values, runs it and writes the result and the replay log."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.ir.graph import Graph
from paramsurgery.core.fs import atomic_open, atomic_write
from paramsurgery.formats.io import load

from paramsurgery.repro.reduce.builder import Builder, Candidate, Verdict
from paramsurgery.repro.reduce.checks import Check, compare_values
from paramsurgery.repro.reduce.values import PASS, Harvest, ValueStore, harvest
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dump_bytes




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
        generated = _random_inputs(graph)
        if generated is None:
            raise ParamSurgeryError("running the graph needs input values: give --inputs "
                                    "inputs.npz (keys = input blob names, optional "
                                    "batch_index_<blob>), or put shapes in the Input layers")
        values = generated
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
        dims = [p.get_int(k, 0) for k in (2, 11, 1, 0)]
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
            save(cand.graph, paramp, binp)
            files[f"{tag}_bin"] = binp
        else:
            atomic_write(paramp, dump_bytes(cand.graph))
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
