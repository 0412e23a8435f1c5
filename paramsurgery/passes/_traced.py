"""What the repair passes read from pnnx's own IR (`model.pnnx.param`): each op's type,
name, params (`dim=0`, `shape=(10,4,8)`, ...) and the traced shape of every operand
(`#4=(3,1,4,?)f32`, `?` = a dynamic size).

The repair passes (fix-reduction, fix-slice, dynamize) see pnnx ops through this small view
of the shared reader `paramsurgery.formats.pnnx_param`.

pnnx renames ops when it writes the ncnn graph (`torch.sum_0` becomes `sum_3`), so an ncnn
layer is paired with its pnnx op by kind and order (`align`): the k-th ncnn Reduction with
the k-th pnnx reduction op, checked by kind, and refused when the counts differ.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

Dim = int | None  # None = dynamic ('?')


@dataclass
class PnnxOp:
    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, tuple[tuple[Dim, ...], str]] = field(default_factory=dict)
    line: int = 0

    def shape(self, blob: str) -> tuple[Dim, ...] | None:
        s = self.shapes.get(blob)
        return s[0] if s else None

    @property
    def in_shape(self) -> tuple[Dim, ...] | None:
        return self.shape(self.inputs[0]) if self.inputs else None

    @property
    def out_shape(self) -> tuple[Dim, ...] | None:
        return self.shape(self.outputs[0]) if self.outputs else None

    def ints(self, key: str) -> list[int] | None:
        """An int or int tuple param (`dim=0`, `dim=(0,1)`, `shape=(10,4,8)`)."""
        v = self.params.get(key)
        if v is None:
            return None
        v = v.strip("()[]")
        if not v:
            return []
        try:
            return [int(x) for x in v.split(",") if x.strip()]
        except ValueError:
            return None


def read_pnnx_param(path: str | os.PathLike) -> list[PnnxOp]:
    """The ops of a `.pnnx.param` (parsed by `paramsurgery.formats.pnnx_param`) with the
    traced shape of each operand they read or write."""
    from ..formats.pnnx_param import read_pnnx_param as read_graph

    graph = read_graph(path)
    ops: list[PnnxOp] = []
    for op in graph.ops:
        shapes: dict[str, tuple[tuple[Dim, ...], str]] = {}
        for name in list(op.inputs) + list(op.outputs):
            operand = graph.operand(name)
            if operand is not None and operand.shape is not None:
                shapes[name] = (tuple(operand.shape), operand.dtype or "")
        ops.append(PnnxOp(op.type, op.name, list(op.inputs), list(op.outputs), dict(op.params),
                          shapes, op.line))
    return ops


def companion_pnnx(param_path: str | os.PathLike | None) -> Path | None:
    """`X.ncnn.param` → `X.pnnx.param` when that file exists (pnnx writes both)."""
    if param_path is None:
        return None
    from ..formats.pnnx_param import find_pnnx_param

    found = find_pnnx_param(param_path)
    return Path(found) if found else None


def load_traced(source: str | os.PathLike | Sequence[PnnxOp] | None) -> list[PnnxOp] | None:
    if source is None:
        return None
    if isinstance(source, (str, os.PathLike)):
        return read_pnnx_param(source)
    return list(source)


def ops_of(ops: Sequence[PnnxOp], types: Sequence[str]) -> list[PnnxOp]:
    return [op for op in ops if op.type in types]
