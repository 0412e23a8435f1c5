"""`--inputshape NAME=[d0,d1,...]`: shapes of named blobs in the numpy order of the array
fed to `ncnn.Mat` (`[c, h, w]`); a dim is an integer or an affine form in symbols (`T`,
`2*T+1`). The flag repeats, and one flag may carry several space-separated specs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.analysis.shapes.affine import Affine, Dim

_SPEC_RE = re.compile(r"^\s*([^=\s]+)\s*=\s*[\[(]([^\]\)]*)[\])]\s*$")

InputShapes = dict[str, tuple[Dim, ...]]


def parse_inputshape(specs: Iterable[str] | str | None) -> InputShapes:
    """`["in0=[T,1024]", "mask=[T,T]"]` (or one string with several specs separated by
    spaces) → `{"in0": (T, 1024), "mask": (T, T)}`. Raises ParamSurgeryError (exit 2)."""
    out: InputShapes = {}
    if specs is None:
        return out
    if isinstance(specs, str):
        specs = [specs]
    for spec in specs:
        for part in _split_specs(spec):
            m = _SPEC_RE.match(part)
            if not m:
                raise ParamSurgeryError(f"--inputshape {part!r}: expected NAME=[d0,d1,...] "
                                        f"(dims as integers or symbols such as T)")
            name, body = m.group(1), m.group(2)
            dims: list[Dim] = []
            for tok in body.split(","):
                tok = tok.strip()
                if not tok:
                    raise ParamSurgeryError(f"--inputshape {part!r}: an empty dim")
                try:
                    d = Affine.parse(tok)
                except ValueError as exc:
                    raise ParamSurgeryError(f"--inputshape {part!r}: {exc}") from None
                if isinstance(d, int) and d <= 0:
                    raise ParamSurgeryError(f"--inputshape {part!r}: dims must be positive")
                dims.append(d)
            if not 1 <= len(dims) <= 4:
                raise ParamSurgeryError(f"--inputshape {part!r}: ncnn blobs have 1 to 4 dims "
                                        f"(the batch axis is not part of the shape)")
            if name in out and out[name] != tuple(dims):
                raise ParamSurgeryError(f"--inputshape gives two shapes for {name!r}")
            out[name] = tuple(dims)
    return out


def _split_specs(text: str) -> list[str]:
    """Split at spaces outside brackets: `"a=[1, 2] b=[T]"` → `["a=[1, 2]", "b=[T]"]`."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch.isspace() and depth == 0:
            if cur:
                parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def format_inputshape(shapes: InputShapes) -> str:
    return " ".join(f"{k}=[{','.join(str(d) for d in v)}]" for k, v in shapes.items())


def inputshape_from_args(args: Any) -> InputShapes:
    """The specs of a parsed command line's `--inputshape` flags (`args.inputshape`)."""
    raw: Sequence = getattr(args, "inputshape", None) or []
    flat = [s for group in raw for s in (group if isinstance(group, list) else [group])]
    return parse_inputshape(flat)


def check_blobs(g, shapes: InputShapes, where: str | None = None) -> None:
    """Every named blob exists in the graph (a typo would silently change nothing)."""
    for name in shapes:
        if not g.has_blob(name):
            inputs = ", ".join(g.inputs) or "none"
            raise ParamSurgeryError(f"--inputshape names blob {name!r}, which the graph does "
                                    f"not have (its inputs: {inputs})", file=where)
