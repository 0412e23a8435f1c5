"""Reader for pnnx's own IR file, `X.pnnx.param`: the graph pnnx traced, before its ncnn
passes, with the traced shape and dtype of every operand.

Layout (one op per line after the `7767517` magic and the `<ops> <operands>` counts)::

    <type> <name> <n_in> <n_out> <inputs…> <outputs…> [key=value …] [@attr=(shape)dtype …]
        [$argname=operand …] [#operand=(shape)dtype …]

- ``key=value`` are the torch op's arguments as pnnx recorded them (`dim=2`, `chunks=2`,
  `pad=(0,-3)`, `expr=mul(@0,2)`, `shape=(1,-1,4,16)`, `mode=constant`, `value=None`);
- ``@name=(shape)dtype`` a weight or constant attribute;
- ``$argname=operand`` which operand fills a named argument;
- ``#operand=(shape)dtype`` the traced shape of an operand. A dimension that differed
  between the two traces of a dynamic export (pnnx `inputshape` / `inputshape2`) is `?`.

`read_pnnx_param` keeps every op's params as text (`Op.param(key)` converts on demand:
int, float, bool, None, tuples, or the string) and every operand's shape as a tuple of
ints with None for `?`. Operands are numbered like pnnx numbers them, which is *not* the
numbering of the `.ncnn.param` pnnx writes next to it (its ncnn passes renumber); the
graph inputs are the tops of `pnnx.Input` in order (ncnn `in0`, `in1`, …) and the graph
outputs the bottoms of `pnnx.Output`, expanded through `prim::TupleConstruct` /
`prim::ListConstruct` (ncnn `out0`, `out1`, …).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Iterator

from paramsurgery.core.errors import ParamSyntaxError

MAGIC = "7767517"

Shape = tuple  # tuple[int | None, ...]; None = `?`

_SHAPE_RE = re.compile(r"\(([^()]*)\)([A-Za-z0-9]*)$")
_INT_RE = re.compile(r"[+-]?[0-9]{1,18}$")  # longer: a float or an error, never int() of 5000 digits
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?$")


@dataclass
class Operand:
    """One pnnx operand (a traced tensor)."""

    name: str
    shape: Shape | None = None  # None when pnnx recorded no shape
    dtype: str | None = None  # "f32", "i32", "i64", "bool", ...
    producer: "Op | None" = None
    consumers: list["Op"] = field(default_factory=list)

    @property
    def dynamic(self) -> bool:
        """True when some dimension is `?` (varied between the two traces)."""
        return self.shape is not None and any(d is None for d in self.shape)

    @property
    def is_int(self) -> bool:
        return self.dtype is not None and self.dtype != "" and \
            (self.dtype[0] in "iu" or self.dtype == "bool")

    def shape_text(self) -> str:
        if self.shape is None:
            return "?"
        return "(" + ",".join("?" if d is None else str(d) for d in self.shape) + ")"


@dataclass
class Op:
    """One pnnx op (a line of the `.pnnx.param`)."""

    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: dict[str, str]  # key -> value text
    attrs: dict[str, tuple[Shape | None, str | None]]  # @name -> (shape, dtype)
    arg_names: dict[str, str]  # $argname -> operand name
    line: int
    # the traced (shape, dtype) of each operand it reads or writes (the graph's operands)
    shapes: dict[str, tuple[Shape, str]] = field(default_factory=dict)

    def param(self, key: str, default: object = None) -> object:
        """A param converted to Python: int, float, bool, None, tuple, or the raw string."""
        text = self.params.get(key)
        if text is None:
            return default
        return parse_value(text)

    def shape(self, blob: str) -> Shape | None:
        s = self.shapes.get(blob)
        return s[0] if s else None

    @property
    def in_shape(self) -> Shape | None:
        return self.shape(self.inputs[0]) if self.inputs else None

    @property
    def out_shape(self) -> Shape | None:
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


@dataclass
class PnnxGraph:
    ops: list[Op]
    operands: dict[str, Operand]
    path: str | None = None
    _ops_by_name: dict[str, Op] | None = field(default=None, repr=False, compare=False)

    def operand(self, name: str) -> Operand | None:
        return self.operands.get(name)

    def op_by_name(self, name: str) -> Op | None:
        """The first op named `name` (the index is built once, on first use)."""
        if self._ops_by_name is None:
            index: dict[str, Op] = {}
            for op in self.ops:
                index.setdefault(op.name, op)
            self._ops_by_name = index
        return self._ops_by_name.get(name)

    @property
    def inputs(self) -> list[Operand]:
        """Graph inputs in order (ncnn `in0`, `in1`, …)."""
        return [self.operands[o] for op in self.ops if op.type == "pnnx.Input"
                for o in op.outputs]

    @property
    def outputs(self) -> list[Operand]:
        """Graph outputs in order (ncnn `out0`, `out1`, …), tuples expanded."""
        out: list[Operand] = []
        for op in self.ops:
            if op.type == "pnnx.Output":
                for name in op.inputs:
                    out.extend(self._expand(name))
        return out

    def _expand(self, name: str) -> Iterator[Operand]:
        stack = [name]
        order: list[Operand] = []
        # iterative, left to right: a tuple of tuples flattens in order
        while stack:
            cur = stack.pop(0)
            operand = self.operands[cur]
            p = operand.producer
            if p is not None and p.type in ("prim::TupleConstruct", "prim::ListConstruct"):
                stack[0:0] = list(p.inputs)
                continue
            order.append(operand)
        return iter(order)

    @property
    def is_dynamic(self) -> bool:
        """True when some graph input has a `?` dimension (a dynamic export)."""
        return any(o.dynamic for o in self.inputs)

    def by_type(self, *types: str) -> list[Op]:
        return [op for op in self.ops if op.type in types]


def parse_value(text: str) -> object:
    """pnnx param text → Python: `True`/`False`/`None`, ints, floats, `(a,b)` tuples,
    anything else as the string."""
    if text == "True":
        return True
    if text == "False":
        return False
    if text == "None":
        return None
    if _INT_RE.match(text):
        return int(text)
    if _FLOAT_RE.match(text):
        return float(text)
    if len(text) >= 2 and text[0] == "(" and text[-1] == ")":
        inner = text[1:-1]
        if not inner:
            return ()
        parts = inner.split(",")
        vals: list[int | float] = []
        for p in parts:
            p = p.strip()
            if _INT_RE.match(p):
                vals.append(int(p))
            elif _FLOAT_RE.match(p):
                vals.append(float(p))
            else:
                return text
        return tuple(vals)
    return text


def parse_shape(text: str) -> tuple[Shape | None, str | None] | None:
    """`(1,?,64)f32` → ((1, None, 64), "f32"); None when the text is not a shape."""
    m = _SHAPE_RE.match(text)
    if m is None:
        return None
    inner, dtype = m.group(1), m.group(2) or None
    if not inner:
        return (), dtype
    dims: list[int | None] = []
    for d in inner.split(","):
        d = d.strip()
        if d == "?":
            dims.append(None)
        elif _INT_RE.match(d):
            dims.append(int(d))
        else:
            return None
    return tuple(dims), dtype


def read_pnnx_param(source: str | os.PathLike | bytes, name: str | None = None) -> PnnxGraph:
    """Parse a `.pnnx.param` from a path, or from its text/bytes (then `name` names it in
    errors). Raises ParamSyntaxError (file:line:col) on a malformed file."""
    if isinstance(source, (bytes, bytearray)):
        text = bytes(source).decode("utf-8", "surrogateescape")
        path = name
    elif isinstance(source, str) and "\n" in source:
        text, path = source, name
    else:
        path = os.fspath(source)
        try:
            with open(path, "rb") as fh:
                text = fh.read().decode("utf-8", "surrogateescape")
        except FileNotFoundError:
            raise ParamSyntaxError("no such file", file=path) from None
        except IsADirectoryError:
            raise ParamSyntaxError("is a directory, not a file", file=path) from None
    return _parse(text, path)


def pnnx_graph(source: "PnnxGraph | str | os.PathLike | None") -> PnnxGraph | None:
    """pnnx's IR as a pass receives it: the graph already parsed (`fix` parses it once per
    run, the commands once per command) handed on as is; a path (the Python API) read."""
    if source is None or isinstance(source, PnnxGraph):
        return source
    return read_pnnx_param(source)


def _parse(text: str, path: str | None) -> PnnxGraph:
    lines = text.splitlines()

    def err(msg: str, line: int, col: int | None = None) -> ParamSyntaxError:
        return ParamSyntaxError(msg, file=path, line=line, col=col)

    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or lines[i].strip() != MAGIC:
        raise err(f"not a .pnnx.param file (expected the magic {MAGIC} on the first line)",
                  i + 1 if i < len(lines) else 1)
    i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    counts = lines[i].split() if i < len(lines) else []
    if len(counts) != 2 or not all(_INT_RE.match(c) for c in counts):
        raise err("expected '<op count> <operand count>'", i + 1)
    n_ops = int(counts[0])
    i += 1
    ops: list[Op] = []
    operands: dict[str, Operand] = {}

    def operand(name: str) -> Operand:
        o = operands.get(name)
        if o is None:
            o = operands[name] = Operand(name)
        return o

    for lineno in range(i + 1, len(lines) + 1):
        raw = lines[lineno - 1]
        toks = raw.split()
        if not toks:
            continue
        if len(toks) < 4:
            raise err("an op line needs '<type> <name> <n_in> <n_out>'", lineno)
        typ, nm, n_in_s, n_out_s = toks[:4]
        if not (_INT_RE.match(n_in_s) and _INT_RE.match(n_out_s)):
            raise err(f"bad input/output counts {n_in_s!r} {n_out_s!r}", lineno,
                      raw.find(n_in_s) + 1)
        n_in, n_out = int(n_in_s), int(n_out_s)
        if n_in < 0 or n_out < 0 or len(toks) < 4 + n_in + n_out:
            raise err(f"op {nm!r} lists fewer than {n_in} inputs + {n_out} outputs", lineno)
        ins = toks[4:4 + n_in]
        outs = toks[4 + n_in:4 + n_in + n_out]
        params: dict[str, str] = {}
        attrs: dict[str, tuple[Shape | None, str | None]] = {}
        arg_names: dict[str, str] = {}
        shapes: dict[str, tuple[Shape | None, str | None]] = {}
        for tok in toks[4 + n_in + n_out:]:
            key, eq, value = tok.partition("=")
            if not eq or not key:
                raise err(f"expected key=value, got {tok!r}", lineno, raw.find(tok) + 1)
            if key[0] == "@":
                attrs[key[1:]] = parse_shape(value) or (None, None)
            elif key[0] == "$":
                arg_names[key[1:]] = value
            elif key[0] == "#":
                shp = parse_shape(value)
                if shp is None:
                    raise err(f"bad operand shape {value!r}", lineno, raw.find(tok) + 1)
                shapes[key[1:]] = shp
            else:
                params[key] = value
        op = Op(typ, nm, ins, outs, params, attrs, arg_names, lineno)
        for o in outs:
            od = operand(o)
            if od.producer is None:
                od.producer = op
        for o in ins:
            operand(o).consumers.append(op)
        for oname, (shp, dtype) in shapes.items():
            od = operand(oname)
            if od.shape is None:
                od.shape, od.dtype = shp, dtype
        ops.append(op)
    if len(ops) < n_ops:
        raise err(f"header declares {n_ops} ops but the file has {len(ops)}", len(lines))
    for op in ops:
        for name in op.inputs + op.outputs:
            od = operands[name]
            if od.shape is not None:
                op.shapes[name] = (tuple(od.shape), od.dtype or "")
    return PnnxGraph(ops, operands, path)


def find_pnnx_param(param_path: str | os.PathLike) -> str | None:
    """The `.pnnx.param` pnnx wrote next to an `.ncnn.param` (`m.ncnn.param` →
    `m.pnnx.param`; `m.param` → `m.pnnx.param`), if it exists."""
    from paramsurgery.core.fs import companion

    return companion(param_path, (".ncnn.param", ".pnnx.param"), (".param", ".pnnx.param"))
