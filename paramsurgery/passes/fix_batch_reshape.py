"""Repair a Reshape pair that loses a 1-D tensor's elements (`paramsurgery fix-batch-reshape`).

pnnx gives every 1-D tensor "no batch axis" (233). When such a tensor is reshaped into one
whose batch axis is the dim that holds its elements (Mimi's RoPE positions:
`arange(T).reshape(1, 1, -1)`, batch axis 2 = the T elements), pnnx 20261020 writes

    Reshape  r1  1 1 pos a  0=1 1=1                       # every non-batch dim: 1; no 13=
    Reshape  r2  1 1 a   b  12=2 13=233 6="0n,1,1"        # reads the elements back from n

`r1` has no output batch param (`13=`), so ncnn reshapes the T elements into one element
(the rest is dropped) and `r2` reads n = 1: every position becomes 0 (measured: the tiny
raw Mimi encoder's RoPE positions are all 0 and its output is NaN).

The pair means "the elements of `pos`, laid out as r2's target with `0n` = their count":
it is replaced by one `Reshape` to that target with `-1` in place of `0n`. Matched only
when r1's dims are all 1, it carries no batch params, r2 is its only reader, r2 moves its
input batch axis out (`12` ≠ 233, `13` = 233) and its target is static except for exactly
one `0n`. Anything else is left alone with the reason (`--explain`).
"""

from __future__ import annotations

from paramsurgery.ir.graph import Graph
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.core.match import Match, MatchFailure
from paramsurgery.patterns.batch_reshape import DIM_PARAMS, NOT_A_CANDIDATE, match_pair

class FixBatchReshape(Pass, name="fix-batch-reshape", repair_order=45,
                      summary="a Reshape pair that drops a 1-D tensor's elements into ncnn's batch axis "
                              "(0=1 1=1 + 12=k 13=233 0n) -> one Reshape"):
    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        todo: list[Match] = []
        for r1 in g.by_type("Reshape"):
            m = match_pair(g, r1)
            if m:
                todo.append(m)
            elif m.kind != NOT_A_CANDIDATE:  # near-misses only, for --explain
                result.skipped.append(MatchFailure(r1.name, m.reason, line=r1.source_line))
        for m in todo:
            r1, r2, target = m.layer, m["r2"], m["target"]
            line = r1.source_line
            before = (f"{r1.name} ({' '.join(r1.params.tokens())}) + "
                      f"{r2.name} ({' '.join(r2.params.tokens())})")
            ids = (0, 1, 2) if len(target) == 3 else DIM_PARAMS  # w,h,c | w,h,d,c
            params = {k: v for k, v in zip(ids, target)}
            src, out, name = r1.inputs[0], r2.outputs[0], r2.name
            g.remove_layer(r2)
            new = g.replace_layer(r1, "Reshape", name, inputs=[src], outputs=[out], params=params)
            result.changes.append(Change(name, "lossy batch reshape pair merged", before,
                                         f"Reshape {name} {' '.join(new.params.tokens())}", line))
            result.modified = True
        if not todo:
            result.notes.append("no lossy batch reshape pair")
        return result
