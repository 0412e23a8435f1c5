"""The lossy Reshape pair pnnx writes when a reshape moves elements into ncnn's batch axis:
`Reshape 0=1 1=1` (all ones, no batch params) then `Reshape 12=k 13=233 6="0n,..."` reading
them back from n, which ncnn keeps at 1. Shared by lint (PS015) and `fix-batch-reshape`."""

from __future__ import annotations

from paramsurgery.analysis.shape_expr import split_top_level
from paramsurgery.core.match import Match, fail, matched
from paramsurgery.core.ncnn import NO_BATCH, UNSET_DIM
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer


DIM_PARAMS = (0, 1, 11, 2)  # w, h, d, c


def _is_int(tok: str) -> bool:
    return tok.lstrip("-").isdigit()


def match_pair(g: Graph, r1: Layer) -> Match:
    """r1 (dims all 1, no batch params) → r2 (reads n back): the lossy pair, or why not."""
    p = r1.params
    if p.get(12, NO_BATCH) != NO_BATCH or p.get(13, NO_BATCH) != NO_BATCH or 6 in p:
        return fail(r1, "carries batch params or a shape expression", kind=NOT_A_CANDIDATE)
    dims = [p.get(k, UNSET_DIM) for k in DIM_PARAMS]
    given = [d for d in dims if d != UNSET_DIM and d != 0]
    if not given or any(d != 1 for d in given):
        return fail(r1, "its target is not all ones", kind=NOT_A_CANDIDATE)
    readers = g.consumer_layers(r1.outputs[0])
    if len(readers) != 1 or readers[0].type != "Reshape":
        return fail(r1, "not read by exactly one Reshape")
    r2 = readers[0]
    q = r2.params
    if q.get(12, NO_BATCH) == NO_BATCH or q.get(13, NO_BATCH) != NO_BATCH:
        return fail(r1, f"its reader {r2.name!r} does not move the batch axis out (12=, 13=233)")
    expr = q.get(6)
    if not isinstance(expr, str):
        return fail(r1, f"its reader {r2.name!r} has no shape expression")
    toks = split_top_level(expr)
    if toks.count("0n") != 1 or not all(t == "0n" or _is_int(t) for t in toks):
        return fail(r1, f"{r2.name!r}'s target {expr!r} is not static except one 0n")
    return matched(r1, r2=r2, target=[-1 if t == "0n" else int(t) for t in toks])


NOT_A_CANDIDATE = "not-a-candidate"  # Match.kind: an ordinary Reshape, not worth --explain


def find_lossy_pairs(g: Graph) -> list[tuple[Layer, Layer]]:
    """(r1, r2) for every pair the pass repairs (for lint)."""
    out = []
    for r1 in g.by_type("Reshape"):
        m = match_pair(g, r1)
        if m:
            out.append((r1, m["r2"]))
    return out
