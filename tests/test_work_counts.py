"""Work counts, not times: the known hot spots of the whole workload (load, validate, static
lint, an edit of every layer, emit) must do work linear in the graph size. Counted on a graph
of n and 4n layers: producer/consumer lookups, param-list parses, value parses and layers
visited by whole-graph walks. A per-layer walk that rescans the graph makes a count grow 16x
instead of 4x, so a quadratic walk cannot come back unnoticed (timing tests would be flaky on
a shared machine; counts are exact)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

import paramsurgery
from paramsurgery.ir import params as params_mod
from paramsurgery.ir.graph import Graph
from paramsurgery.lint import lint_graph

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from bench_graphs import SHAPES  # noqa: E402
from paramsurgery.analysis.shapes import infer_shapes
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.param_text import dumps

LOOKUPS = ("producer", "producer_slot", "consumers", "consumer_layers", "predecessors",
           "successors")


def _count_workload(text: str, monkeypatch: pytest.MonkeyPatch) -> Counter:
    counts: Counter = Counter()

    def counting(name: str, fn):  # noqa: ANN001, ANN202
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    with monkeypatch.context() as m:
        for name in LOOKUPS:
            m.setattr(Graph, name, counting(name, getattr(Graph, name)))
        iter_ = Graph.__iter__

        def walk(self):  # noqa: ANN001, ANN202
            for layer in iter_(self):
                counts["layers walked"] += 1
                yield layer
        m.setattr(Graph, "__iter__", walk)
        m.setattr(params_mod, "_tokens", counting("param lists parsed", params_mod._tokens))
        m.setattr(params_mod, "parse_value", counting("values parsed", params_mod.parse_value))
        g = paramsurgery.loads(text)
        validate(g)
        lint_graph(g, run=False)
        for layer in list(iter_(g)):
            layer.name = layer.name + "_e"
        dumps(g)
    return counts


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_workload_work_grows_linearly(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 1500
    _clear_parse_caches()
    small = _count_workload(SHAPES[shape](n), monkeypatch)
    _clear_parse_caches()
    big = _count_workload(SHAPES[shape](4 * n), monkeypatch)
    assert big["layers walked"] >= 4 * n  # the counters see the work
    for what in set(small) | set(big):
        # 4x the layers: at most 4x the work (+ a constant), never 16x
        assert big[what] <= 4.4 * small[what] + 64, (what, small[what], big[what])


def test_identical_param_lines_are_parsed_once_per_distinct_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_parse_caches()
    counts = _count_workload(SHAPES["chain"](4000), monkeypatch)
    # the chain writes two distinct param lines (Convolution, BinaryOp): 12 distinct tokens
    assert counts["values parsed"] <= 12, counts


def _clear_parse_caches() -> None:
    params_mod._PARSED.clear()
    params_mod._LINES.clear()


def test_shape_analysis_parses_each_distinct_param_line_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The static shape analysis (lint's PS203, `paramsurgery shapes`, `view`) reads params
    of every layer: layers repeating a line share one parse instead of one per layer."""
    _clear_parse_caches()
    counts: Counter = Counter()
    tokens = params_mod._tokens

    def counting(text: str):  # noqa: ANN202
        counts["param lists parsed"] += 1
        return tokens(text)
    monkeypatch.setattr(params_mod, "_tokens", counting)
    g = paramsurgery.loads(SHAPES["chain"](3000))
    infer_shapes(g)
    # the chain writes two distinct param lines (Convolution, BinaryOp)
    assert counts["param lists parsed"] <= 2, counts


def test_shared_param_line_is_copied_on_edit() -> None:
    _clear_parse_caches()
    g = paramsurgery.loads(SHAPES["chain"](30))
    convs = list(g.by_type("Convolution"))
    assert convs[0].params[0] == convs[1].params[0] == 16
    convs[0].params[0] = 8
    assert convs[0].params[0] == 8 and convs[1].params[0] == 16
    assert convs[1].params.tokens()[0] == "0=16" and not convs[1].params.edited
    assert "0=8" in dumps(g) and dumps(g).count("0=16") == len(convs) - 1


def _expansions_of_cone(n: int, sinks: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Layers `cone.cone` expands for `sinks` readers of one n-layer chain (their cones
    overlap entirely)."""
    import networkx as nx

    from paramsurgery.ir import cone as cone_mod

    lines = ["Input in 0 1 b0"] + [f"ReLU r{i} 1 1 b{i} b{i + 1}" for i in range(n)]
    lines.append(f"Split sp 1 {sinks} b{n} " + " ".join(f"s{k}" for k in range(sinks)))
    lines += [f"ReLU o{k} 1 1 s{k} out{k}" for k in range(sinks)]
    g = paramsurgery.loads(f"7767517\n{len(lines)} {n + 2 * sinks + 1}\n" + "\n".join(lines) + "\n")
    count = 0
    bfs = nx.generic_bfs_edges

    def counting_bfs(G, source, neighbors=None):  # noqa: ANN001, ANN202
        def counted(v):  # noqa: ANN001, ANN202
            nonlocal count
            count += 1
            return neighbors(v)
        return bfs(G, source, neighbors=counted)

    monkeypatch.setattr(cone_mod.nx, "generic_bfs_edges", counting_bfs)
    sink_ids = [g.layer(f"o{k}").id for k in range(sinks)]
    assert len(cone_mod.cone(g, sink_ids)) == n + 2 + sinks
    # the same cut kept within every layer (reduce's form of the cut)
    assert len(cone_mod.cone(g, sink_ids, within=[layer.id for layer in g])) == n + 2 + sinks
    return count


def test_cone_expands_each_layer_once_across_overlapping_sinks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # one search per sink over the shared chain would grow with sinks x n
    assert _expansions_of_cone(400, 40, monkeypatch) <= 2 * (400 + 2 * 40 + 2)


def _collections_in_pass(build, make, sites: int) -> int:  # noqa: ANN001
    """Collections started while the pass runs, with the threshold at 1: any allocation made
    with the collector on starts one."""
    import gc

    count = 0

    def record(phase: str, info: dict) -> None:
        nonlocal count
        count += phase == "start"

    g = build(sites)
    p = make(g, sites)
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    gc.callbacks.append(record)
    try:
        assert p(g).modified
    finally:
        gc.callbacks.remove(record)
        gc.set_threshold(*threshold)
    return count


def _bench_cases() -> dict:
    from bench_passes import cases

    return cases()


@pytest.mark.parametrize("case", sorted(_bench_cases()))
def test_passes_run_with_the_collector_paused(case: str) -> None:
    """A pass allocates per site while the whole graph is live: each collection during it
    rescans the graph. `extract` once ran its plan (which builds `g.nx`, a few dicts per
    layer) with the collector on: 651 young and 2 full collections at 100k sites against 66
    and 0 at 10k (tools/bench_passes.py), t(100k)/t(10k) 20. The collections a pass starts
    (a few once it re-enables the collector) must not grow with its sites (unpaused,
    extract's grew from 330 at 20 sites to 2127 at 200)."""
    import gc

    assert gc.isenabled()  # else the counts below could not differ
    build, make = _bench_cases()[case]
    _collections_in_pass(build, make, 3)  # first calls: imports, caches
    small, big = (_collections_in_pass(build, make, n) for n in (20, 200))
    assert big <= 2 * small + 10, (case, small, big)
