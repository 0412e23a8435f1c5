"""A Reshape to static dims whose input, at the shapes pnnx traced, has another element
count: ncnn keeps the first elements (or reads past them), with no error. pnnx 20261020
writes one as the broadcast helper `<op>_ncnnreshape<k>` of a `BinaryOp` operand whose
traced shape has a dynamic dim: Whisper's `embed_positions.weight[:T]` (`(?, 32)`) added to
`(1, T, 32)` becomes `Crop` to T then `Reshape 0=32 1=1`: every position gets row 0 (the
dynamic export is off by 0.4-0.8 relative at every length, its traced one too). Shared by
lint (PS019) and `fix-lossy-reshape`.

The repairable form: same rank as the input, every target dim equal to the input's but one,
which is 1 where the input's is not: that dim becomes `-1` (the Reshape then keeps the input's
layout at every length, as the broadcast meant).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer

DIMS = {1: (0,), 2: (1, 0), 3: (2, 1, 0), 4: (2, 11, 1, 0)}  # rank -> param ids, numpy order


@dataclass
class LossyReshape:
    layer: Layer
    given: tuple[int, ...]        # the input's shape at the traced shapes (numpy order)
    target: tuple[int, ...]       # the Reshape's dims (numpy order)
    pid: int | None               # the param to set to -1, None when not repairable

    def describe(self) -> str:
        n_in, n_out = _prod(self.given), _prod(self.target)
        return (f"Reshape {self.layer.name!r} to {list(self.target)} ({n_out} elements) reads "
                f"{list(self.given)} ({n_in} elements) at the traced shapes")


def _prod(xs: tuple[int, ...]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def static_target(layer: Layer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(dims in numpy order, their param ids) of a Reshape that names every dim itself (no
    0, -1, shape expression or batch params), else None."""
    p = layer.params
    if p.get(6) not in (None, "") or p.get(12, 233) != 233 or p.get(13, 233) != 233:
        return None
    given = {pid: v for pid in (2, 11, 1, 0) if isinstance(v := p.get(pid), int) and v != -233}
    if not given:
        return None
    present = list(given)
    dims = tuple(given[pid] for pid in present)
    if any(d <= 0 for d in dims):
        return None
    return dims, tuple(present)


def traced_inputshape(pnnx: object, traced_path: str | os.PathLike | None,
                      g: Graph) -> dict[str, tuple[int, ...]] | None:
    """Every graph input's shape at pnnx's (first) trace, numpy order without the batch
    axis: from `X_ncnn.py` next to `X.pnnx.param` (dynamic dims) or pnnx's static shapes;
    None when a dim is not known."""
    from paramsurgery.analysis.frozen_extent import trace_evidence

    ev = trace_evidence(pnnx, traced_path, None)
    values = {d.symbol: d.traced for d in ev.dims}
    out: dict[str, tuple[int, ...]] = {}
    for blob in g.inputs:
        shape = ev.inputshape.get(blob)
        if shape is None:
            return None
        dims = tuple(values.get(d, d) if isinstance(d, str) else d for d in shape)
        if any(not isinstance(d, int) for d in dims):
            return None
        out[blob] = dims  # type: ignore[assignment]
    return out


def find_lossy_reshapes(g: Graph, inputshape: Mapping[str, tuple[int, ...]]) -> list[LossyReshape]:
    """Every static Reshape whose input has another element count at `inputshape`."""
    from paramsurgery.analysis.shapes import infer_shapes

    cands = [(r, t) for r in g.by_type("Reshape") if (t := static_target(r)) is not None]
    if not cands:
        return []
    sm = infer_shapes(g, inputshape=dict(inputshape))
    out = []
    for r, (target, pids) in cands:
        given = sm.known(r.inputs[0]) if r.inputs else None
        if given is None or not all(isinstance(d, int) for d in given):
            continue
        given_t = tuple(int(d) for d in given)  # type: ignore[arg-type]
        if _prod(given_t) == _prod(target):
            continue
        pid = None
        if len(given_t) == len(target):
            off = [i for i, (a, b) in enumerate(zip(given_t, target)) if a != b]
            if len(off) == 1 and target[off[0]] == 1:
                pid = pids[off[0]]
        out.append(LossyReshape(r, given_t, target, pid))
    return out
