"""Generic numeric verification: a rewritten graph against its reference, on any graph,
from an input spec (`--inputshape`, symbolic dims allowed, plus value kinds inferred from
the graph; or `--inputs inputs.npz`). Both graphs run in child processes on the same
arrays at each chosen value of the symbols; every output of the reference that the
candidate also has is compared (max |a-b| / max |b|)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.analysis.shapes.affine import evaluate
from paramsurgery.analysis.shapes import infer_shapes


@dataclass
class EquivalenceCheck:
    reference: str
    envs: list[dict[str, int]]
    tol: float = 1e-5
    rel: dict[str, float] = field(default_factory=dict)  # "T=13 out0" -> relative error
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.rel) and max(self.rel.values()) <= self.tol

    def format(self) -> str:
        if self.error:
            return f"parity: FAILED: {self.error}"
        worst = max(self.rel.values(), default=0.0)
        where = ", ".join(k for k, v in self.rel.items() if v == worst)
        state = "ok" if self.ok else "FAILED"
        return (f"parity: {state} against {self.reference} ({len(self.rel)} output run(s); "
                f"max rel error {worst:.2e} at {where}; tol {self.tol:g})")


def verify_equivalent(candidate: str | os.PathLike, reference: str | os.PathLike, *,
                      bin: str | os.PathLike | None = None,
                      reference_bin: str | os.PathLike | None = None,
                      inputshape: Mapping[str, tuple] | None = None,
                      values: Mapping[str, Sequence[int]] | None = None,
                      inputs: str | os.PathLike | None = None, tol: float = 1e-5,
                      seed: int = 0) -> EquivalenceCheck:
    """Run both graphs on the same inputs and compare. `values`: the symbols' values to
    run at (each symbol's list is walked in step; default 7 and 13). Input shapes not in
    `inputshape` come from the reference's Input layers."""
    from paramsurgery.formats.io import load
    from paramsurgery.analysis.shapes import normalize_inputshape
    from paramsurgery.analysis.shapes.feeds import input_kinds, make_feeds

    gr, gc = load(reference), load(candidate)
    shapes = normalize_inputshape(dict(inputshape or {}))
    static = infer_shapes(gr, inputshape=shapes)
    spec = {}
    for blob in gr.inputs:
        s = shapes.get(blob) or static.known(blob)
        if s is None and inputs is None:
            raise ParamSurgeryError(f"--verify: the shape of input blob {blob!r} is not known: "
                                    f"give --inputshape {blob}=[d0,...] or --inputs inputs.npz",
                                    file=os.fspath(reference))
        if s is not None:
            spec[blob] = s
    symbols = sorted({sym for s in spec.values() for d in s
                      for sym in getattr(d, "symbols", ())})
    vals = {sym: list((values or {}).get(sym, (7, 13))) for sym in symbols}
    n_runs = max((len(v) for v in vals.values()), default=1)
    envs = [{sym: v[min(i, len(v) - 1)] for sym, v in vals.items()} for i in range(n_runs)]
    kinds = input_kinds(gr, list(spec))
    outputs = [b for b in gr.outputs if gc.has_blob(b)]
    check = EquivalenceCheck(os.fspath(reference), envs, tol)
    if not outputs:
        check.error = "the two graphs share no output blob"
        return check
    from paramsurgery.core import progress

    tags = [" ".join(f"{k}={v}" for k, v in env.items()) for env in envs]
    progress.plan(f"parity through ncnn against {os.fspath(reference)}: "
                  f"{len(envs)} run(s) ({', '.join(t or 'the fixed shapes' for t in tags)})")
    with progress.task("parity", total=len(envs), unit="run") as task:
        for env, tag in zip(envs, tags):
            concrete = {b: tuple(evaluate(d, env) for d in s) for b, s in spec.items()}
            feeds = make_feeds(gr, concrete, seed=seed, npz=inputs, kinds=kinds)
            rel = run_side_by_side((candidate, bin, feeds),
                                   (reference, reference_bin or bin, feeds),
                                   outputs, what="the rewritten graph")
            if isinstance(rel, str):
                check.error = f"{tag}: {rel}"
                return check
            check.rel.update({f"{tag} {name}".strip(): v for name, v in rel.items()})
            worst = max(rel.values(), default=0.0)
            task.done(f"  {tag or 'fixed shapes'}: max rel {worst:.2e} over "
                      f"{', '.join(rel)} ({'ok' if worst <= tol else 'MISMATCH'})")
    return check


def format_parity(header: str, error: str | None, rows: Sequence[str], ok: bool, *,
                  failed: str = "FAILED") -> str:
    """A check's text: the header, then `failed: error` alone, or the rows and the verdict
    line `parity: ok|FAILED`."""
    if error:
        return f"{header}\n  {failed}: {error}"
    return "\n".join([header, *(f"  {r}" for r in rows), "  parity: " + ("ok" if ok else "FAILED")])


Side = tuple[str | os.PathLike, str | os.PathLike | None, Mapping]  # param, bin, feeds


def run_side_by_side(candidate: Side, reference: Side, outputs: Sequence[str], *,
                     what: str) -> dict[str, float] | str:
    """Run a rewritten graph (`what` names it) and its reference, each in a child process,
    and compare `outputs`: output → max|a - b| / max|b|, or why they cannot be compared (a
    side does not run, shapes differ)."""
    from paramsurgery.runtime.child import run_isolated

    a = run_isolated(candidate[0], candidate[1], candidate[2], list(outputs))
    b = run_isolated(reference[0], reference[1], reference[2], list(outputs))
    for res, who in ((a, what), (b, "the reference")):
        if not res.ok:
            return f"{who} does not run: {res.describe()}"
    rel = {}
    for name in outputs:
        x, y = a.outputs[name], b.outputs[name]
        if x.shape != y.shape:
            return f"{name} shapes differ ({x.shape} vs {y.shape})"
        scale = float(np.max(np.abs(y))) if y.size else 1.0
        diff = float(np.max(np.abs(x.astype(np.float64) - y))) if y.size else 0.0
        rel[name] = diff / (scale or 1.0)
    return rel
