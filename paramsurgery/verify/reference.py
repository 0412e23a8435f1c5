"""Run a graph through ncnn (child process, fp32) on a torch reference's inputs and compare
its outputs with the reference's: `max|ncnn - torch| / max|torch| <= tol` per output.

The reference is a `.npz` as `paramsurgery lint` reads it (`lint.conformance.Reference`):
blob-named arrays, or `input_<name>` / `output_<name>` paired with the graph's blobs
through pnnx's traced shapes. pnnx's batch axis of each array is read, in this order, from
the reference's `batch_index_<blob>` scalars, its io side file (`X.ref.io.json`, the fixture
manifest's `io` record: `lint.conformance.read_io_sidefile`), pnnx's `X_ncnn.py` next to the
source graph; only an array none of them names is guessed as lint does (a leading 1 of a
rank >= 2 array), and the check says which ones were guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.core.layer_types import ELEMENT_MOVING
from paramsurgery.formats.pnnx_reference import io_sidefile
from paramsurgery.ir.graph import Graph
from paramsurgery.patterns.match import readers_below
from paramsurgery.runtime.child import NO_BATCH, Feed, Fetch, RunOptions, run_isolated


@dataclass
class ReferenceCheck:
    reference: str
    tol: float
    status: str  # the run's status: ok | load_param_failed | crash | ...
    detail: str = ""
    rel: dict[str, float] = field(default_factory=dict)  # output → relative error
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    guessed: list[str] = field(default_factory=list)  # blobs whose batch axis was guessed

    @property
    def ok(self) -> bool:
        return (self.status == "ok" and not self.shapes
                and all(v <= self.tol for v in self.rel.values()))

    def format(self) -> str:
        if self.status != "ok":
            return f"verify against {self.reference}: ncnn {self.detail}"
        parts = [f"{b} rel {v:.2e}" for b, v in self.rel.items()]
        parts += [f"{b}: ncnn shape {got}, torch {want}" for b, (got, want) in
                  self.shapes.items()]
        verdict = "ok" if self.ok else f"MISMATCH (tol {self.tol:g})"
        note = ""
        if self.guessed and not self.ok:
            note = (f" (batch axis guessed for {', '.join(self.guessed)}: give "
                    f"{io_sidefile(self.reference)} or batch_index_<blob> entries)")
        return f"verify against {self.reference}: {verdict}: {', '.join(parts)}{note}"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reference": self.reference, "status": self.status,
                "rel": self.rel, "detail": self.detail, "batch_guessed": self.guessed}


def _pnnx_script_batch(source: str | None) -> tuple[dict[str, int], dict[str, int]]:
    """The batch axes pnnx's `X_ncnn.py` next to `source` feeds and reads (none: empty)."""
    from paramsurgery.formats.pnnx_reference import find_pnnx_script, read_pnnx_script

    script = find_pnnx_script(source) if source else None
    if script is None:
        return {}, {}
    specs, outs = read_pnnx_script(script)
    return {s.blob: s.batch_index for s in specs if s.batch_index is not None}, outs


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    want64 = np.asarray(want, dtype=np.float64)
    diff = np.abs(np.asarray(got, dtype=np.float64).reshape(want64.shape) - want64)
    worst = float(diff.max()) if diff.size else 0.0
    if not np.isfinite(worst):
        return float("inf")
    scale = float(np.abs(want64).max()) if want64.size else 0.0
    return worst / scale if scale > 0 else worst


def _as_read(graph: Graph, blob: str, array: np.ndarray) -> np.ndarray:
    """An integer reference input as the graph reads it: ncnn's Embed reads its bottom as
    int32 (ids); every other layer reads float32, so integers another layer reads (positions
    once `lower` removed HF's `.float()` cast: fix's "contract change") are fed as their
    float32 values, not as int32 bit patterns."""
    if array.dtype.kind not in "iu":
        return array
    # through the layers that only move elements (ids sliced or reshaped before their Embed,
    # e.g. the codec's codes), to the layers that read the values
    readers = list(readers_below(graph.consumer_layers, [blob], ELEMENT_MOVING))
    if readers and all(r.type != "Embed" for r in readers):
        return array.astype(np.float32)
    return array


def verify_against_reference(param: str, bin: str | None, reference: str, *, graph: Graph,
                             pnnx: str | os.PathLike | None = None, source: str | None = None,
                             tol: float = 1e-4) -> ReferenceCheck:
    """Compare `param`+`bin` with `reference`; `graph` is `param` loaded, `pnnx` pnnx's IR
    of `source` (found next to it when not given), used to pair `input_*`/`output_*`."""
    from paramsurgery.formats.pnnx_param import find_pnnx_param, read_pnnx_param
    from paramsurgery.formats.pnnx_reference import Reference

    pn_path = pnnx or (find_pnnx_param(source) if source else None)
    pn = read_pnnx_param(pn_path) if pn_path else None
    try:
        ref = Reference.load(reference, graph, pn)
    except (ValueError, KeyError, OSError) as exc:
        raise ParamSurgeryError(f"cannot use this reference: {exc}", file=reference) from None
    with np.load(reference) as data:
        values = {blob: np.asarray(data[key]) for blob, key in ref.output_keys.items()}
    script_in, script_out = _pnnx_script_batch(source)
    for spec in ref.inputs:
        if spec.batch_index is None:
            spec.batch_index = script_in.get(spec.blob)
    out_batch = {**script_out, **ref.output_batch}
    guessed = [s.blob for s in ref.inputs if s.guessed] + [b for b in values
                                                            if b not in out_batch]
    feeds = {s.blob: Feed(_as_read(graph, s.blob, s.make_array()), s.effective_batch_index())
             for s in ref.inputs}
    fetches = [Fetch(b, out_batch.get(b, 0 if len(values[b].shape) >= 2 and
                                      values[b].shape[0] == 1 else NO_BATCH))
               for b in values]
    res = run_isolated(param, bin, feeds, fetches, RunOptions())
    check = ReferenceCheck(reference, tol, res.status, res.describe(), guessed=guessed)
    if not res.ok:
        return check
    for blob, want in values.items():
        got = res.outputs[blob]
        if got.size != want.size:
            check.shapes[blob] = (tuple(got.shape), tuple(want.shape))
        else:
            check.rel[blob] = relative_error(got, want)
    return check
