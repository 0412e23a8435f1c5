"""What the repair passes read from pnnx's own IR (`model.pnnx.param`), and how its ops are
paired with the layers of the ncnn graph pnnx wrote next to it.

The op model is the shared reader's, `paramsurgery.formats.pnnx_param.Op`: type, name,
params as text (`dim=0`, `shape=(10,4,8)`; `Op.ints`, `Op.param`) and the traced shape of
every operand it reads or writes (`Op.shape(blob)`, `?` = None).

Pairing (`align`, `op_named`): pnnx keeps a converter leftover's name in the ncnn graph
(`Tensor.expand_39` stays `Tensor.expand_39`), so leftovers are found by name and type;
layers pnnx converted are renamed (`torch.sum_0` becomes `sum_3`), so they are paired by
kind and order: the k-th ncnn Reduction with the k-th pnnx reduction op, all or none,
refused (MatchFailure) when the counts differ or a pair does not agree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from paramsurgery.formats.pnnx_param import Op, PnnxGraph
from paramsurgery.core.match import MatchFailure

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer

PnnxOp = Op  # the name the repair passes used for it
Dim = int | None  # None = dynamic ('?')


def pnnx_op(type: str, name: str, inputs: list[str], outputs: list[str],
            params: dict[str, str] | None = None,
            shapes: dict[str, tuple[tuple[Dim, ...], str]] | None = None, line: int = 0) -> Op:
    """An op built by hand (tests, synthetic graphs)."""
    return Op(type, name, list(inputs), list(outputs), dict(params or {}), {}, {}, line,
              dict(shapes or {}))


def read_pnnx_param(path: str | os.PathLike) -> list[Op]:
    """The ops of a `.pnnx.param`, each with the traced shapes of its operands."""
    from paramsurgery.formats.pnnx_param import read_pnnx_param as read_graph

    return list(read_graph(path).ops)


def companion_pnnx(param_path: str | os.PathLike | None) -> Path | None:
    """`X.ncnn.param` → `X.pnnx.param` when that file exists (pnnx writes both)."""
    if param_path is None:
        return None
    from paramsurgery.formats.pnnx_param import find_pnnx_param

    found = find_pnnx_param(param_path)
    return Path(found) if found else None


def load_traced(source: str | os.PathLike | Sequence[Op] | None) -> list[Op] | None:
    if source is None:
        return None
    if isinstance(source, (str, os.PathLike)):
        return read_pnnx_param(source)
    return list(source)


def ops_of(ops: Sequence[Op], types: Sequence[str]) -> list[Op]:
    return [op for op in ops if op.type in types]


def align(layers: Sequence["Layer"], ops: Sequence[Op], *, what: str = "layers",
          op_what: str = "ops",
          agree: Callable[["Layer", Op], str | None] | None = None) -> dict[int, Op]:
    """Layer id → pnnx op, pairing renamed (converted) layers by kind and order: the k-th
    layer with the k-th op. All or none: MatchFailure when the counts differ ("the graph has N
    <what>, the .pnnx.param M <op_what>") or `agree(layer, op)` names a reason."""
    if len(layers) != len(ops):
        raise MatchFailure(layers[0] if layers else None,
                      f"the graph has {len(layers)} {what}, the .pnnx.param {len(ops)} "
                      f"{op_what}")
    out: dict[int, Op] = {}
    for layer, op in zip(layers, ops):
        why = agree(layer, op) if agree is not None else None
        if why:
            raise MatchFailure(layer, why)
        out[layer.id] = op
    return out


def op_named(pnnx: PnnxGraph, layer: "Layer", path: str | None) -> Op:
    """pnnx's op for a converter leftover (pnnx keeps its name and type in the ncnn graph;
    found through the graph's name index, not a scan per layer); MatchFailure naming the file
    when there is none."""
    op = pnnx.op_by_name(layer.name)
    if op is not None and op.type == layer.type:
        return op
    raise MatchFailure(layer, f"{path} has no {layer.type} op named {layer.name!r}")
