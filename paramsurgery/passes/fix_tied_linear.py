"""`fix-tied-linear`: a Linear whose weight is a graph tensor (a tied lm_head) that pnnx
wrote as `InnerProduct(table) + BinaryOp(hidden)` becomes one InnerProduct of the hidden
states with the table as its weight (lint PS017; detection: `patterns/tied_linear.py`).

    MemoryData wte 0=C 1=V → InnerProduct fc (input: wte) → BinaryOp add (+ h) → out
    InnerProduct fc 1 1 h out 0=V 1=0 2=V*C   (weight: wte's V×C rows, the table itself)

`h·Wᵀ` is what torch computes (`F.linear(h, W)`, W the tied table: pnnx's IR op
`nn.Linear 2 1 W h`), at every length: the rewrite has no length in it. The weight written
is the table's values (the graph's own W); when the InnerProduct's stored weight differs
from them the report says so. The MemoryData goes when nothing else reads it. Needs the
weights (`--bin`).
"""

from __future__ import annotations

import numpy as np

from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.formats.weights import set_weights
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import Pass, PassResult, RepairContext
from paramsurgery.passes.options import internal
from paramsurgery.patterns.match import above_splits
from paramsurgery.patterns.tied_linear import find_tied_linears


class FixTiedLinear(Pass, name="fix-tied-linear", tag="tied", repair_order=47,
                    summary="a tied Linear pnnx wrote as InnerProduct(table) + BinaryOp(hidden) -> one "
                            "InnerProduct of the hidden states with the table as weight (needs --bin)"):
    # the layers only, no weights written: for an export `fix` repairs only to compare it
    # with its input (a `--pair` given without its .bin: its weights are never written, and
    # the rewrite's params do not depend on them)
    structure_only: bool = internal(default=False)

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "FixTiedLinear | None":
        if not asked:
            return None
        return cls(structure_only=ctx.compare_only and not ctx.weights)

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        sites = find_tied_linears(g)
        if not sites:
            result.notes.append("no tied Linear written as table input + hidden bias")
            return result
        for s in sites:
            if not self.structure_only and (s.table.weights is None or not len(s.table.weights)):
                raise PassRefused(f"MemoryData {s.table.name!r}: the tied weight's values are "
                                  f"in the weights; give --bin", line=s.fc.source_line)
        for s in sites:
            v, c = s.table.params.get(1), s.table.params.get(0)
            has = s.table.weights is not None and len(s.table.weights) > 0
            w = s.table.weights[0].array().reshape(-1).astype(np.float32) if has else None
            stored = s.fc.weights.get("weight") if s.fc.weights is not None else None
            own = stored.array().reshape(-1) if stored is not None else None
            same = w is not None and own is not None and own.shape == w.shape and \
                bool(np.array_equal(own, w))
            line, name = s.fc.source_line, s.fc.name
            before = (f"InnerProduct {name} reads {s.table.name!r} ({v}x{c}), BinaryOp "
                      f"{s.add.name} adds {s.hidden!r}")
            params = s.fc.params.copy()
            hidden = next(b for b in s.add.inputs if b != s.fc.outputs[0])  # a Split copy
            feeds = [s.table] + above_splits(g, s.fc.inputs[0])[1]
            g.remove_layer(s.fc)
            new = g.replace_layer(s.add, "InnerProduct", name, inputs=[hidden],
                                  outputs=[s.out], params=params)
            if w is not None:
                set_weights(new, {"weight": w.copy()})
            g.remove_dead(feeds)
            note = "its stored weight equals the table" if same else \
                "its stored weight differed from the table: the table's values are written" \
                if w is not None else "the layers only: no weights given, none written"
            result.changes.append(Change(name, f"tied Linear: the hidden states times the "
                                               f"table {s.table.name!r} ({note})", before,
                                         f"InnerProduct {name} 1 1 {hidden} {s.out} "
                                         + " ".join(params.tokens()), line))
        result.modified = True
        return result
