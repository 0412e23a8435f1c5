"""`fix-lossy-reshape`: a Reshape to static dims whose input has another element count at
the shapes pnnx traced (lint PS019; detection: `patterns/lossy_reshape.py`): pnnx's
broadcast helper `<op>_ncnnreshape<k>` wrote 1 for a dim that was dynamic.

    Crop     slice1_0             2 1 table x 9 20="1h"      # (T, 32): the table to the length
    Reshape  add_0_ncnnreshape0   1 1 9 10 0=32 1=1          # (1, 32): rows 1.. lost
    Reshape  add_0_ncnnreshape0   1 1 9 10 0=32 1=-1         # (T, 32) at every T

Only the form where every other dim equals the input's is rewritten (the 1 becomes -1: the
Reshape keeps the input's layout at every length, as torch's broadcast did); any other
element-count mismatch is refused naming the layer. The traced shapes come from pnnx's
`X_ncnn.py` next to `X.pnnx.param` (its input tensors) or pnnx's static input shapes.
"""

from __future__ import annotations

import os

from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.formats.pnnx_param import (PnnxGraph, find_pnnx_param, pnnx_graph,
                                             read_pnnx_param)
from paramsurgery.passes.base import Pass, PassResult, RepairContext
from paramsurgery.passes.options import internal, option
from paramsurgery.patterns.lossy_reshape import find_lossy_reshapes, traced_inputshape

RESHAPE_AXES = {0: "w", 1: "h", 11: "d", 2: "c"}


def _pnnx_beside(param: str) -> PnnxGraph | None:
    """pnnx's IR next to the input, parsed (None when pnnx wrote none there)."""
    found = find_pnnx_param(param)
    return read_pnnx_param(found) if found is not None else None


class FixLossyReshape(Pass, name="fix-lossy-reshape", tag="reshape", repair_order=46,
                      summary="a static Reshape that drops elements at the traced shapes (pnnx's broadcast "
                              "helper with 1 for a dynamic dim) -> that dim inferred (-1)"):
    # pnnx's IR, parsed by the command (`load`) or `fix` (a path given by the Python API is read)
    traced: "PnnxGraph | str | os.PathLike | None" = option(
        default=None, flag="--pnnx", metavar="PNNX_PARAM", load=read_pnnx_param,
        beside_input=_pnnx_beside,
        help="pnnx's X.pnnx.param (default: next to the input; its X_ncnn.py gives the traced "
             "input shapes)")
    # the traced shapes, when known
    inputshape: dict[str, tuple[int, ...]] | None = internal(default=None)

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "FixLossyReshape | None":
        return cls(ctx.pnnx) if asked else None

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        shapes = self.inputshape
        if shapes is None:
            if self.traced is None:
                raise PassRefused("the traced input shapes are needed: pnnx's X.pnnx.param next "
                                  "to the input (with its X_ncnn.py), or --pnnx")
            pnnx = pnnx_graph(self.traced)
            assert pnnx is not None
            shapes = traced_inputshape(pnnx, pnnx.path, g)
            if shapes is None:
                raise PassRefused(f"{pnnx.path}: the traced input shapes are not recorded "
                                  f"(keep pnnx's X_ncnn.py next to it)")
        sites = find_lossy_reshapes(g, shapes)
        bad = [s for s in sites if s.pid is None]
        if bad:
            s = bad[0]
            raise PassRefused(f"{s.describe()}; no single dim of 1 to infer, so no repair: "
                              f"make the shape explicit in the model", line=s.layer.source_line)
        for s in sites:
            assert s.pid is not None
            layer = s.layer
            before = layer.params.get(s.pid)
            layer.set(s.pid, -1)
            result.changes.append(Change(layer.name, f"{s.pid}({RESHAPE_AXES[s.pid]}) (inferred "
                                                     f"(-1): {s.describe()})", before, -1,
                                         layer.source_line))
            result.modified = True
        if not sites:
            result.notes.append("no Reshape drops elements at the traced shapes")
        return result
