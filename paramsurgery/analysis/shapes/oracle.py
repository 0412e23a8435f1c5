"""ncnn as the shape oracle: run the graph (zero weights from `DataReaderFromEmpty`, or the
real `.bin`) in a child process at two or three values of each symbol, `lightmode` off,
extract every blob, and fit each dim as an affine form in the symbols. A dim that moves
in a way no affine form explains (`⌊T/2⌋`, `min(T, 17)`) is reported as not affine.

Runs: all symbols at a base value; each symbol moved alone; all moved together (the check).
One child loads the net once and does every run (a crash in ncnn cannot take the caller
down: it becomes an error naming the run).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from paramsurgery.core.npz import save_arrays

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.ir.graph import Graph
from paramsurgery.analysis.shapes.affine import Affine, Dim, evaluate, normalize
from paramsurgery.analysis.shapes.shapemap import Shape, ShapeMap
from paramsurgery.analysis.shapes.spec import InputShapes
from paramsurgery.formats.param_text import dump_bytes
from paramsurgery.formats.param_text import dumps

DEFAULT_VALUES = (16, 19, 23)


def sample_envs(symbols: list[str], values: Mapping[str, list[int]] | None = None) \
        -> list[dict[str, int]]:
    """Base run, one run per symbol moved alone, one with all moved (for the check)."""
    values = dict(values or {})
    vals = {s: list(values.get(s, DEFAULT_VALUES)) for s in symbols}
    for s, v in vals.items():
        if len(v) < 3 or len(set(v[:3])) < 3:
            raise ParamSurgeryError(f"the oracle needs three different values of {s}, got {v}")
    base = {s: v[0] for s, v in vals.items()}
    envs = [base]
    for s in symbols:
        envs.append({**base, s: vals[s][1]})
    envs.append({s: v[2] for s, v in vals.items()})
    return envs


def oracle_shapes(g: Graph, inputshape: InputShapes, *, static: ShapeMap | None = None,
                  bin: str | os.PathLike | None = None,
                  values: Mapping[str, list[int]] | None = None,
                  timeout: float = 600.0, seed: int = 0,
                  npz: str | os.PathLike | None = None, isolated: bool = True) -> ShapeMap:
    """ncnn's shapes of every blob, fitted as affine forms in the symbols of `inputshape`.
    `isolated=False` runs ncnn in this process (only for graphs known to be safe)."""
    from paramsurgery.analysis.shapes.feeds import make_feeds
    from paramsurgery.analysis.shapes.static import propagate

    static = static if static is not None else propagate(g, inputshape)
    feeds_shapes: dict[str, Shape] = {}
    for blob in g.inputs:
        s = inputshape.get(blob) or static.known(blob)
        if s is None:
            raise ParamSurgeryError(f"the shape of input blob {blob!r} is not known: give "
                                    f"--inputshape {blob}=[d0,d1,...]", file=g.source.path)
        feeds_shapes[blob] = s
    for blob, s in inputshape.items():
        feeds_shapes.setdefault(blob, s)
    symbols: dict[str, None] = {}
    for s in feeds_shapes.values():
        for d in s:
            if isinstance(d, Affine):
                for sym in d.symbols:
                    symbols[sym] = None
    envs = sample_envs(list(symbols), values) if symbols else [{}]
    feeds_per_run = []
    for env in envs:
        concrete = {b: tuple(evaluate(d, env) for d in s) for b, s in feeds_shapes.items()}
        if any(d <= 0 for s in concrete.values() for d in s):
            raise ParamSurgeryError(f"an input shape is not positive at {env}: choose other "
                                    f"values for the symbols")
        feeds_per_run.append(make_feeds(g, concrete, seed=seed, npz=npz))
    blobs = g.blob_names()
    from paramsurgery.core import progress

    at = "; ".join(", ".join(f"{k}={v}" for k, v in env.items()) for env in envs) or "one run"
    progress.plan(f"shapes --oracle: every blob through ncnn at {at}", aside=True)
    with progress.task("shapes --oracle", total=len(envs), unit="run") as task:
        if isolated:
            runs = run_all_blobs(g, bin, feeds_per_run, blobs, timeout=timeout)
        else:
            runs = extract_all(dumps(g), None if bin is None else os.fspath(bin),
                               feeds_per_run, blobs)
        task.done(n=len(envs))
    return fit(g, blobs, envs, runs, static, feeds_shapes)


def fit(g: Graph, blobs: list[str], envs: list[dict[str, int]], runs: list[dict],
        static: ShapeMap, given: Mapping[str, Shape]) -> ShapeMap:
    out = ShapeMap()
    symbols = list(envs[0])
    for blob in blobs:
        found = [r.get(blob) for r in runs]
        obs = [o for o in found if o is not None]
        if len(obs) != len(found):
            continue
        ranks = {len(o["shape"]) for o in obs}
        if len(ranks) != 1:
            out.not_affine[blob] = "its rank changes with " + ", ".join(symbols)
            continue
        dims: list[Dim | None] = []
        why = ""
        for axis in range(ranks.pop()):
            seq = [o["shape"][axis] for o in obs]
            d = _fit_dim(seq, envs, symbols)
            if d is None:
                why = f"dim {axis} is {seq} at {envs}"
            dims.append(d)
        if why:
            out.not_affine[blob] = why
        out.shapes[blob] = tuple(dims)
        out.source[blob] = "input" if blob in given else "oracle"
        n = obs[0].get("n", 1)
        if n != 1:
            out.batch[blob] = n
        st = static.shape_of(blob)
        if st is not None and _disagree(st, out.shapes[blob]):
            out.notes.append(f"{blob}: ncnn gives {ShapeMap.format_shape(out.shapes[blob])}, the "
                             f"static rules {ShapeMap.format_shape(st)}")
    out.channel_origin = dict(static.channel_origin)
    return out


def _fit_dim(seq: list[int], envs: list[dict[str, int]], symbols: list[str]) -> Dim | None:
    if not symbols:
        return seq[0]
    base = envs[0]
    coef: dict[str, int] = {}
    for i, s in enumerate(symbols, start=1):
        dv = envs[i][s] - base[s]
        dd = seq[i] - seq[0]
        if dd % dv:
            return None
        coef[s] = dd // dv
    const = seq[0] - sum(c * base[s] for s, c in coef.items())
    form = normalize(Affine(const, coef))
    for env, v in zip(envs, seq):
        if evaluate(form, env) != v:
            return None
    return form


def _disagree(a: Shape, b: Shape) -> bool:
    if len(a) != len(b):
        return True
    return any(x is not None and y is not None and x != y for x, y in zip(a, b))


# --------------------------------------------------------------------------- child process
def run_all_blobs(g: Graph, bin: str | os.PathLike | None, feeds_per_run: list[dict],
                  blobs: list[str], *, timeout: float = 600.0) -> list[dict]:
    """For each run: blob → {"shape": [...numpy order...], "n": n} (missing = ncnn could
    not produce it). Runs in one child process."""
    from paramsurgery.runtime.launch import module_argv, run_child

    with tempfile.TemporaryDirectory(prefix="paramsurgery-shapes-") as tmp:
        d = Path(tmp)
        (d / "graph.param").write_bytes(dump_bytes(g))
        names = []
        for i, feeds in enumerate(feeds_per_run):
            save_arrays(d / f"feeds{i}.npz", {f"a{j}": a for j, a in enumerate(feeds.values())})
            names.append(list(feeds))
        spec = {"param": str(d / "graph.param"), "bin": None if bin is None else os.fspath(bin),
                "runs": names, "blobs": blobs}
        (d / "spec.json").write_text(json.dumps(spec))
        proc = run_child(*module_argv("paramsurgery.analysis.shapes.oracle", d), timeout=timeout)
        if proc.timed_out:
            raise ParamSurgeryError(f"the ncnn shape run gave no result after {timeout:.0f} s",
                                    file=g.source.path) from None
        results = []
        for i in range(len(feeds_per_run)):
            f = d / f"shapes{i}.json"
            if not f.exists():
                raise ParamSurgeryError(f"ncnn failed on shape run {i} ({proc.how()}): "
                                        f"{proc.tail(3, chr(10))}",
                                        file=g.source.path)
            results.append(json.loads(f.read_text()))
        return results


def extract_all(param: str, bin: str | None, feeds_per_run: list[dict],
                blobs: list[str]) -> list[dict]:
    """In this process: every blob's shape per run (what the child does; a graph that may
    crash ncnn must go through `run_all_blobs`). `param` is a path or the text itself."""
    from paramsurgery.runtime.child import Feed, NcnnRunError, RunOptions, _to_mat, load_net

    try:
        net = load_net(param, bin, RunOptions(light_mode=False, packing=False))
    except NcnnRunError as exc:
        raise ParamSurgeryError(f"ncnn cannot load the graph: {exc}") from None
    results = []
    for feeds in feeds_per_run:
        out: dict[str, dict] = {}
        with net.create_extractor() as ex:
            ex.set_light_mode(False)
            mats = {n: _to_mat(Feed(a)) for n, a in feeds.items()}
            for n, m in mats.items():
                if ex.input(n, m) != 0:
                    raise ParamSurgeryError(f"ncnn refused input {n!r}")
            for b in blobs:
                ret, m = ex.extract(b, 1)  # raw: SDPA kv caches are opaque; no packing here
                if ret != 0 or m.dims == 0:
                    continue
                out[b] = {"shape": _numpy_shape(m), "n": int(getattr(m, "n", 1) or 1)}
        results.append(out)
    return results


def _child(d: Path) -> int:
    spec = json.loads((d / "spec.json").read_text())
    feeds_per_run = []
    for i, names in enumerate(spec["runs"]):
        with np.load(d / f"feeds{i}.npz") as data:
            feeds_per_run.append({n: data[f"a{j}"] for j, n in enumerate(names)})
    try:
        results = extract_all(spec["param"], spec["bin"], feeds_per_run, spec["blobs"])
    except ParamSurgeryError as exc:
        sys.stderr.write(str(exc) + "\n")
        return 1
    for i, out in enumerate(results):
        (d / f"shapes{i}.json").write_text(json.dumps(out))
    return 0


def _numpy_shape(m) -> list[int]:
    if m.dims == 1:
        return [m.w]
    if m.dims == 2:
        return [m.h, m.w]
    if m.dims == 3:
        return [m.c, m.h, m.w]
    return [m.c, m.d, m.h, m.w]


if __name__ == "__main__":  # pragma: no cover - exercised through run_all_blobs
    sys.exit(_child(Path(sys.argv[1])))
