"""The precision search: which layers go wrong under fp16 / bf16 / int8, and the smallest set
to keep in full precision (`31=` feature masks; int8: left unquantized) that brings every
output within tolerance.

Every number is measured through ncnn (`batch.run_variants`), against the fp32 run of the
same graph on the same inputs (parity options, one thread):

1. the fp32 reference and the all-reduced run, every blob extracted. Bit for bit equal
   everywhere: the mode has no effect on this machine (ncnn falls back to fp32 where the
   CPU or the build lacks it), said as such, and nothing else is run;
2. per layer, the run with only that layer reduced (every other layer masked): its error
   at the outputs ("alone"), and whether the mode takes effect in it at all (its tops or
   the outputs differ from fp32 in any bit); the all-reduced run's error at the layer's
   tops is its "downstream" error (what has accumulated there);
3. a control run with every layer masked: it must be bit-identical to fp32 (else masks do
   not neutralise the mode on this graph, and the search says so);
4. greedy by contribution: the layers in effect, worst alone first; the shortest prefix
   whose masking brings every output within tolerance;
5. minimality: for each kept layer, the run without it must break the tolerance; a layer
   whose removal keeps every output within it is dropped (the least harmful first) and the
   check starts again. The runs of the last round are the proof (`Search.proof`).

With `reference` (torch's outputs: `precision --pnnx`), steps 4–5 and every error at the
outputs are measured against the model instead of ncnn's fp32 run; the per-layer tops and
the bit-for-bit checks stay against ncnn's fp32 run (the only place every blob exists).
When ncnn's fp32 run itself is not within tolerance of the reference, no kept set can
reach it (every layer kept is that run): the search says so and stops.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.keep_precision import KeepPrecision
from paramsurgery.passes.quantize_int8 import QuantizeInt8
from paramsurgery.runtime.child import FeedLike
from paramsurgery.verify.compare.ncnn_run import cache_tops, extractable_blobs
from paramsurgery.verify.compare.options import ALIASES, PARITY
from paramsurgery.verify.precision.batch import Variant, VariantResult, Worker
from paramsurgery.verify.precision.metrics import METRICS, Metric, rel_error, same_bits

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer
    from paramsurgery.passes.quantize_int8 import Int8Table

# prefixes of the greedy order evaluated per child run (the search stops at the first
# chunk holding a prefix within tolerance)
PREFIX_CHUNK = 8


class SearchFailed(RuntimeError):
    """A run the search needs did not complete (ncnn crashed, timed out, failed to load)."""


def mode_settings(mode: str) -> dict[str, object]:
    settings = dict(PARITY)
    if mode == "int8":  # the quantized graph's int8 layers run in int8
        settings["use_int8_inference"] = True
    else:
        settings.update(ALIASES[mode])
    return settings


@dataclass
class LayerRow:
    name: str
    type: str
    line: int | None
    in_effect: bool = False
    alone: float | None = None        # the metric at the outputs, only this layer reduced
    downstream: float | None = None   # the metric at its tops, every layer reduced
    downstream_rel: float | None = None
    kept: bool = False


@dataclass
class Search:
    mode: str
    metric: Metric
    tol: float
    outputs: list[str]
    in_effect: bool = True
    rows: list[LayerRow] = field(default_factory=list)
    all_reduced: dict[str, float] = field(default_factory=dict)   # per output
    final: dict[str, float] = field(default_factory=dict)         # per output, kept masked
    kept: list[str] = field(default_factory=list)
    proof: dict[str, float] = field(default_factory=dict)  # kept layer -> worst without it
    control_exact: bool = True  # every layer masked: bit-identical to fp32
    kept_fp32_exact: bool | None = None  # the written graph run in fp32: bit-identical
    text: str = ""  # the graph with the kept set masked (what -o writes)
    graph_out: Graph | None = None  # the same as a graph (int8: with its new weights)
    runs: int = 0
    reached: bool = True  # the tolerance is met (by the kept set)
    notes: list[str] = field(default_factory=list)
    reference: str = "fp32"  # what the outputs are held against: "fp32" (ncnn) or "torch"
    fp32_vs_reference: dict[str, float] = field(default_factory=dict)  # torch only

    def worst(self, per_output: Mapping[str, float]) -> float:
        return self.metric.worst(list(per_output.values()))


class _Runner:
    """Builds and runs the variants: fp16/bf16 mask the kept layers (`keep-precision`, same
    weights); int8 quantizes every candidate but the kept ones (`quantize-int8` with the
    calibration table: each variant has its own weights)."""

    def __init__(self, graph: Graph, bin: str | None, feeds: Mapping[str, FeedLike],
                 mode: str, timeout: float, table: "Int8Table | None" = None) -> None:
        self.graph = graph
        self.bin = bin
        self.feeds = feeds
        self.mode = mode
        self.table = table
        self.reduced = mode_settings(mode)
        self.worker = Worker(bin, feeds, timeout=timeout)
        # each layer by a unique key: its name, or `name#k` for the k-th (k ≥ 2) layer of a
        # name pnnx wrote more than once (two `splitncnn_0` are two layers to keep or not)
        self.keys: dict[str, "Layer"] = {}
        seen: dict[str, int] = {}
        for layer in graph:
            seen[layer.name] = seen.get(layer.name, 0) + 1
            k = seen[layer.name]
            self.keys[layer.name if k == 1 else f"{layer.name}#{k}"] = layer
        self.runs = 0
        self._tmp = tempfile.TemporaryDirectory(prefix="paramsurgery-int8-") if table else None
        self._n = 0

    def close(self) -> None:
        self.worker.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def reduced_graph(self, keep: Sequence[str] | set[str]) -> Graph:
        """The graph with everything reduced but `keep` (int8: quantized; else masked)."""
        if self.table is not None:
            # no requantize fusion: every top stays fp32 (an int8 top is no error to read)
            names = {self.keys[k].name for k in keep}
            return QuantizeInt8(self.table, frozenset(names), requantize=False)(self.graph).graph
        return KeepPrecision(tuple(sorted(self.keys[k].id for k in keep)), self.mode)(self.graph).graph

    def candidates(self) -> list[str]:
        """The keys of the layers the mode reduces."""
        if self.table is not None:
            return list(QuantizeInt8(self.table, requantize=False)(self.graph)
                        .data["int8_layers"])
        return [k for k, layer in self.keys.items() if layer.type != "Input"]

    def text(self, keep: Sequence[str] | set[str]) -> str:
        """The graph the -o output writes for `keep`."""
        return dumps(self.reduced_graph(keep))

    def run(self, variants: list[Variant], what: str) -> list[VariantResult]:
        self.runs += len(variants)
        results = self.worker.run(variants)
        for r in results:
            if not r.ok:
                raise SearchFailed(f"ncnn could not run {what}: {r.status} {r.message}".strip())
        return results

    def original(self, blobs: Sequence[str]) -> Variant:
        return Variant(dumps(self.graph), dict(PARITY), list(blobs))

    def variant(self, keep: Sequence[str] | set[str], blobs: Sequence[str],
                settings: Mapping[str, object] | None = None) -> Variant:
        if self.table is None or self._tmp is None:
            return Variant(self.text(keep), settings or self.reduced, list(blobs))
        g = self.reduced_graph(keep)
        self._n += 1
        param = os.path.join(self._tmp.name, f"v{self._n}.param")
        binp = os.path.join(self._tmp.name, f"v{self._n}.bin")
        save(g, param, bin=binp)
        with open(param) as fh:
            text = fh.read()
        return Variant(text, settings or self.reduced, list(blobs), bin=binp)


def search(graph: Graph, bin: str | None, feeds: Mapping[str, FeedLike], *, mode: str,
           metric: str = "rel", tol: float | None = None, timeout: float = 600.0,
           table: "Int8Table | None" = None,
           reference: Mapping[str, np.ndarray] | None = None) -> Search:
    """`table` (int8 only): the calibration the quantized variants use; `reference`: the
    outputs to hold every run against (torch's), instead of ncnn's fp32 run."""
    if mode == "int8" and table is None:
        raise ValueError("int8 needs a calibration table")
    m = METRICS[metric]
    tol = m.default_tol if tol is None else tol
    hidden = cache_tops(graph)
    outputs = [b for b in graph.outputs if b not in hidden]
    res = Search(mode, m, tol, outputs, reference="fp32" if reference is None else "torch")
    runner = _Runner(graph, bin, feeds, mode, timeout, table if mode == "int8" else None)
    try:
        return _search(res, graph, runner, reference)
    finally:
        runner.close()


def _search(res: Search, graph: Graph, runner: _Runner,
            reference: Mapping[str, np.ndarray] | None) -> Search:
    from paramsurgery.verify.precision.torch_reference import aligned

    m, tol, outputs, mode = res.metric, res.tol, res.outputs, res.mode
    blobs = [b for b, _ in extractable_blobs(graph)]
    ref_r, full_r = runner.run([runner.original(blobs), runner.variant((), blobs)],
                               "the fp32 and the reduced runs")
    fp32, full = ref_r.arrays, full_r.arrays
    ref = dict(fp32)  # what the outputs are held against (the other blobs: ncnn's fp32)
    if reference is not None:
        ref.update({o: aligned(reference[o], fp32[o], o) for o in outputs})
        res.fp32_vs_reference = _per_output(m, fp32, ref, outputs)
    res.all_reduced = _per_output(m, full, ref, outputs)
    names = runner.candidates()
    cands = [runner.keys[k] for k in names]
    res.rows = [LayerRow(k, layer.type, layer.source_line) for k, layer in zip(names, cands)]
    if all(same_bits(full[b], fp32[b]) for b in blobs):
        res.in_effect = False
        res.final = dict(res.all_reduced)
        res.runs = runner.runs
        res.notes.append(f"{mode} not in effect here: every blob of the {mode} run is bit "
                         f"for bit the fp32 run (ncnn falls back to fp32 for every layer of "
                         f"this graph on this machine); nothing was measured" if mode != "int8"
                         else "int8 not in effect here: every blob of the quantized graph is "
                         "bit for bit the fp32 run; nothing was measured")
        return res
    for row, layer in zip(res.rows, cands):
        errs = [m.measure(full[t], fp32[t]) for t in layer.outputs if t in full]
        rels = [rel_error(full[t], fp32[t]) for t in layer.outputs if t in full]
        row.downstream = m.worst(errs) if errs else None
        row.downstream_rel = max(rels) if rels else None
    every = set(names)
    alone_vs = [runner.variant(every - {k}, outputs + [t for t in layer.outputs
                                                       if t not in outputs])
                for k, layer in zip(names, cands)]
    control_v = runner.variant(every, outputs)
    *alone_r, control_r = runner.run(alone_vs + [control_v], "the per-layer runs")
    for row, r in zip(res.rows, alone_r):
        row.alone = res.worst(_per_output(m, r.arrays, ref, outputs))
        row.in_effect = any(not same_bits(r.arrays[b], fp32[b]) for b in r.arrays)
    res.control_exact = all(same_bits(control_r.arrays[b], fp32[b]) for b in outputs)
    if not res.control_exact:
        res.notes.append(f"every layer masked, the {mode} run still differs from fp32: the "
                         f"masks do not neutralise {mode} on this graph")
    effective = [row for row in res.rows if row.in_effect]
    if res.fp32_vs_reference and not m.within(res.worst(res.fp32_vs_reference), tol):
        res.reached = False
        res.final = dict(res.fp32_vs_reference)
        worst = max(res.fp32_vs_reference, key=lambda o: m.badness(res.fp32_vs_reference[o]))
        res.notes.append(f"ncnn's fp32 run is already {m.format(res.fp32_vs_reference[worst])} "
                         f"from torch at {worst}: no set of layers kept in fp32 brings the "
                         f"outputs within {m.format(tol)} (compare --pnnx shows where fp32 "
                         f"diverges)")
        res.runs = runner.runs
        return res
    if m.within(res.worst(res.all_reduced), tol):
        res.final = dict(res.all_reduced)
        res.graph_out = runner.reduced_graph(())
        res.text = dumps(res.graph_out)
        res.runs = runner.runs
        return res
    order = sorted(effective, key=lambda r: -m.badness(r.alone if r.alone is not None else 0.0))
    kept, final = _shortest_prefix(runner, res, [r.name for r in order], ref)
    if kept is None:
        res.reached = False
        res.kept = [r.name for r in order]
        res.final = _per_output(m, control_r.arrays, ref, outputs)
        res.notes.append("no set of masks brings every output within tolerance")
    else:
        res.kept, res.final, res.proof = _minimal(runner, res, kept, final, ref)
    for row in res.rows:
        row.kept = row.name in res.kept
    res.graph_out = runner.reduced_graph(res.kept)
    res.text = dumps(res.graph_out)
    if mode == "int8":  # the written graph is int8: its run is the final error above
        res.runs = runner.runs
        return res
    (check,) = runner.run([Variant(res.text, dict(PARITY), outputs)], "the written graph in fp32")
    res.kept_fp32_exact = all(same_bits(check.arrays[o], fp32[o]) for o in outputs)
    if not res.kept_fp32_exact:
        res.notes.append("the graph with the masks, run in fp32, differs from the input's fp32 "
                         "run")
    res.runs = runner.runs
    return res


def _per_output(m: Metric, arrays: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
                outputs: Sequence[str]) -> dict[str, float]:
    return {o: m.measure(arrays[o], ref[o]) for o in outputs}


def _shortest_prefix(runner: _Runner, res: Search, order: list[str],
                     ref: Mapping[str, np.ndarray]) -> tuple[list[str] | None, dict[str, float]]:
    for start in range(0, len(order), PREFIX_CHUNK):
        ks = range(start + 1, min(start + PREFIX_CHUNK, len(order)) + 1)
        results = runner.run([runner.variant(order[:k], res.outputs) for k in ks],
                             "the greedy prefixes")
        for k, r in zip(ks, results):
            per = _per_output(res.metric, r.arrays, ref, res.outputs)
            if res.metric.within(res.worst(per), res.tol):
                return order[:k], per
    return None, {}


def _minimal(runner: _Runner, res: Search, kept: list[str], final: dict[str, float],
             ref: Mapping[str, np.ndarray]) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """Drop kept layers the tolerance does not need until each one is needed."""
    m = res.metric
    while True:
        results = runner.run([runner.variant([k for k in kept if k != j], res.outputs)
                              for j in kept], "the minimality checks")
        without = {j: _per_output(m, r.arrays, ref, res.outputs) for j, r in zip(kept, results)}
        worst = {j: res.worst(per) for j, per in without.items()}
        needless = [j for j in kept if m.within(worst[j], res.tol)]
        if not needless:
            return kept, final, worst
        drop = min(needless, key=lambda j: m.badness(worst[j]))
        final = without[drop]
        kept = [k for k in kept if k != drop]
