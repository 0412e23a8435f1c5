"""The precision search: which layers go wrong under fp16 / bf16, and the smallest set to
keep in full precision (`31=` feature masks) that brings every output within tolerance.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from paramsurgery.formats.param_text import dumps
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.keep_precision import KeepPrecision
from paramsurgery.runtime.child import FeedLike
from paramsurgery.verify.compare.ncnn_run import cache_tops, extractable_blobs
from paramsurgery.verify.compare.options import ALIASES, PARITY
from paramsurgery.verify.precision.batch import Variant, VariantResult, Worker
from paramsurgery.verify.precision.metrics import METRICS, Metric, rel_error, same_bits

# prefixes of the greedy order evaluated per child run (the search stops at the first
# chunk holding a prefix within tolerance)
PREFIX_CHUNK = 8


class SearchFailed(RuntimeError):
    """A run the search needs did not complete (ncnn crashed, timed out, failed to load)."""


def mode_settings(mode: str) -> dict[str, object]:
    settings = dict(PARITY)
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
    runs: int = 0
    reached: bool = True  # the tolerance is met (by the kept set)
    notes: list[str] = field(default_factory=list)

    def worst(self, per_output: Mapping[str, float]) -> float:
        return self.metric.worst(list(per_output.values()))


class _Runner:
    def __init__(self, graph: Graph, bin: str | None, feeds: Mapping[str, FeedLike],
                 mode: str, timeout: float) -> None:
        self.graph = graph
        self.bin = bin
        self.feeds = feeds
        self.mode = mode
        self.reduced = mode_settings(mode)
        self.worker = Worker(bin, feeds, timeout=timeout)
        self.runs = 0

    def text(self, keep: Sequence[str] | set[str]) -> str:
        """The graph with `keep` masked, written by the pass `-o` uses (`keep-precision`:
        the masks and the fp32 guards in front of them)."""
        return dumps(KeepPrecision(sorted(keep), self.mode)(self.graph).graph)

    def run(self, variants: list[Variant], what: str) -> list[VariantResult]:
        self.runs += len(variants)
        results = self.worker.run(variants)
        for r in results:
            if not r.ok:
                raise SearchFailed(f"ncnn could not run {what}: {r.status} {r.message}".strip())
        return results

    def variant(self, keep: Sequence[str] | set[str], blobs: Sequence[str],
                settings: Mapping[str, object] | None = None) -> Variant:
        return Variant(self.text(keep), settings or self.reduced, list(blobs))


def search(graph: Graph, bin: str | None, feeds: Mapping[str, FeedLike], *, mode: str,
           metric: str = "rel", tol: float | None = None, timeout: float = 600.0) -> Search:
    m = METRICS[metric]
    tol = m.default_tol if tol is None else tol
    hidden = cache_tops(graph)
    outputs = [b for b in graph.outputs if b not in hidden]
    res = Search(mode, m, tol, outputs)
    runner = _Runner(graph, bin, feeds, mode, timeout)
    try:
        return _search(res, graph, runner)
    finally:
        runner.worker.close()


def _search(res: Search, graph: Graph, runner: _Runner) -> Search:
    m, tol, outputs, mode = res.metric, res.tol, res.outputs, res.mode
    blobs = [b for b, _ in extractable_blobs(graph)]
    ref_r, full_r = runner.run([runner.variant((), blobs, dict(PARITY)),
                                runner.variant((), blobs)], "the fp32 and the reduced runs")
    ref, full = ref_r.arrays, full_r.arrays
    res.all_reduced = _per_output(m, full, ref, outputs)
    cands = [layer for layer in graph if layer.type != "Input"]
    res.rows = [LayerRow(layer.name, layer.type, layer.source_line) for layer in cands]
    if all(same_bits(full[b], ref[b]) for b in blobs):
        res.in_effect = False
        res.final = dict(res.all_reduced)
        res.runs = runner.runs
        res.notes.append(f"{mode} not in effect here: every blob of the {mode} run is bit "
                         f"for bit the fp32 run (ncnn falls back to fp32 for every layer of "
                         f"this graph on this machine); nothing was measured")
        return res
    for row, layer in zip(res.rows, cands):
        errs = [m.measure(full[t], ref[t]) for t in layer.outputs if t in full]
        rels = [rel_error(full[t], ref[t]) for t in layer.outputs if t in full]
        row.downstream = m.worst(errs) if errs else None
        row.downstream_rel = max(rels) if rels else None
    names = [layer.name for layer in cands]
    every = set(names)
    alone_vs = [runner.variant(every - {layer.name}, outputs + [t for t in layer.outputs
                                                               if t not in outputs])
                for layer in cands]
    control_v = runner.variant(every, outputs)
    *alone_r, control_r = runner.run(alone_vs + [control_v], "the per-layer runs")
    for row, r in zip(res.rows, alone_r):
        row.alone = res.worst(_per_output(m, r.arrays, ref, outputs))
        row.in_effect = any(not same_bits(r.arrays[b], ref[b]) for b in r.arrays)
    res.control_exact = all(same_bits(control_r.arrays[b], ref[b]) for b in outputs)
    if not res.control_exact:
        res.notes.append(f"every layer masked, the {mode} run still differs from fp32: the "
                         f"masks do not neutralise {mode} on this graph")
    effective = [row for row in res.rows if row.in_effect]
    if m.within(res.worst(res.all_reduced), tol):
        res.final = dict(res.all_reduced)
        res.text = runner.text(())
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
    res.text = runner.text(res.kept)
    (check,) = runner.run([Variant(res.text, dict(PARITY), outputs)], "the written graph in fp32")
    res.kept_fp32_exact = all(same_bits(check.arrays[o], ref[o]) for o in outputs)
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
