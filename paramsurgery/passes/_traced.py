"""What the repair passes read from pnnx's own IR (`model.pnnx.param`): each op's type,
name, params (`dim=0`, `shape=(10,4,8)`, ...) and the traced shape of every operand
(`#4=(3,1,4,?)f32`, `?` = a dynamic size).

Private to the repair passes (fix-reduction, fix-slice, dynamize) until the shared reader
`paramsurgery.formats.pnnx_param` lands; only the little they need is parsed here.

pnnx renames ops when it writes the ncnn graph (`torch.sum_0` becomes `sum_3`), so an ncnn
layer is paired with its pnnx op by kind and order (`align`): the k-th ncnn Reduction with
the k-th pnnx reduction op, checked by kind, and refused when the counts differ.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

_SHAPE_RE = re.compile(r"^#([^=]+)=\(([^)]*)\)(\w*)$")
_TOKEN_RE = re.compile(r'(\S+?)=("[^"]*"|\([^)]*\)|\[[^\]]*\]|\S+)')

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
    ops: list[PnnxOp] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for no, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if len(parts) < 4:
            continue
        typ, name = parts[0], parts[1]
        try:
            nin, nout = int(parts[2]), int(parts[3])
        except ValueError:
            continue
        ins = parts[4:4 + nin]
        outs = parts[4 + nin:4 + nin + nout]
        rest = " ".join(parts[4 + nin + nout:])
        op = PnnxOp(typ, name, ins, outs, line=no)
        for m in _TOKEN_RE.finditer(rest):
            key, val = m.group(1), m.group(2)
            if key.startswith("#"):
                sm = _SHAPE_RE.match(f"{key}={val}" + _dtype_after(rest, m.end()))
                if sm:
                    dims = tuple(None if d.strip() == "?" else int(d) for d in
                                 sm.group(2).split(",") if d.strip())
                    op.shapes[sm.group(1)] = (dims, sm.group(3))
            elif key.startswith("@") or key.startswith("$"):
                continue
            else:
                op.params[key] = val
        ops.append(op)
    return ops


def _dtype_after(text: str, pos: int) -> str:
    m = re.match(r"(\w*)", text[pos:])
    return m.group(1) if m else ""


def companion_pnnx(param_path: str | os.PathLike | None) -> Path | None:
    """`X.ncnn.param` → `X.pnnx.param` when that file exists (pnnx writes both)."""
    if param_path is None:
        return None
    p = Path(param_path)
    name = p.name
    if name.endswith(".ncnn.param"):
        cand = p.with_name(name[: -len(".ncnn.param")] + ".pnnx.param")
        if cand.is_file():
            return cand
    return None


def load_traced(source: str | os.PathLike | Sequence[PnnxOp] | None) -> list[PnnxOp] | None:
    if source is None:
        return None
    if isinstance(source, (str, os.PathLike)):
        return read_pnnx_param(source)
    return list(source)


def ops_of(ops: Sequence[PnnxOp], types: Sequence[str]) -> list[PnnxOp]:
    return [op for op in ops if op.type in types]
