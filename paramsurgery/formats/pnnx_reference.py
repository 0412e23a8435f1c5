"""pnnx's record of a trace and torch's reference outputs, as files: the traced input shapes
(pnnx's test script `X_ncnn.py`, `--input-shape` text), the reference (`ref.npz` /
`X.ref.npz`) with its io side file, and how a blob's shape is compared with a traced one
(torch order, size-1 dimensions dropped on both sides, `?` matching any size; ncnn's batch
`n` at any position). Read by lint's conformance run, the repairs and compare.
"""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from paramsurgery.core.ncnn import NO_BATCH
from paramsurgery.formats.pnnx_mapping import input_key as _in_key, ordered_outputs as _ordered_outputs

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import Operand, PnnxGraph
    from paramsurgery.ir.graph import Graph


# =========================================================================== inputs

@dataclass
class InputSpec:
    """One graph input for a run: torch shape, dtype (`f32`/`i32`) and pnnx's batch_index
    (the numpy axis that becomes ncnn's batch `n`; 233 = none; None = unknown)."""

    blob: str
    shape: tuple[int, ...]
    dtype: str = "f32"
    batch_index: int | None = None
    array: np.ndarray | None = None  # given data (a reference); else generated

    @property
    def guessed(self) -> bool:
        return self.batch_index is None

    def effective_batch_index(self) -> int:
        if self.batch_index is not None:
            return self.batch_index
        return 0 if len(self.shape) >= 2 and self.shape[0] == 1 else NO_BATCH

    def make_array(self, seed: int = 0) -> np.ndarray:
        if self.array is not None:
            return self.array
        if self.dtype.startswith("i") or self.dtype.startswith("u"):
            return np.zeros(self.shape, np.int32)
        rng = np.random.default_rng(seed)
        return (0.5 * rng.standard_normal(self.shape)).astype(np.float32)

    def text(self) -> str:
        return "[" + ",".join(map(str, self.shape)) + "]" + self.dtype


_SPEC_RE = re.compile(r"\[([0-9,\s]*)\]\s*([a-z]+[0-9]*)?(?:@([0-9]+))?")


def parse_input_shapes(text: str | Sequence[str], blobs: Sequence[str] | None = None) -> list[InputSpec]:
    """pnnx's `inputshape` syntax, optionally with the batch axis: `[1,4,10]f32@0,[7]i32`
    (dtype default f32; `@233` = no batch axis; without `@` it is guessed). Blob names
    default to `in0`, `in1`, …"""
    if not isinstance(text, str):
        text = ",".join(text)
    specs: list[InputSpec] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _SPEC_RE.match(text, pos)
        if m is None:
            raise ValueError(f"bad input shape at {text[pos:]!r} (expected like [1,4,10]f32@0)")
        dims = tuple(int(d) for d in m.group(1).replace(" ", "").split(",") if d)
        dtype = m.group(2) or "f32"
        if dtype not in ("f32", "f16", "i32", "i64", "i8", "u8", "bool"):
            raise ValueError(f"unknown dtype {dtype!r} in {m.group(0)!r}")
        bi = int(m.group(3)) if m.group(3) else None
        i = len(specs)
        specs.append(InputSpec(blobs[i] if blobs and i < len(blobs) else f"in{i}", dims,
                               "i32" if dtype.startswith(("i", "u")) else "f32", bi))
        pos = m.end()
        while pos < len(text) and text[pos] in ", ":
            pos += 1
    return specs


_RAND_RE = re.compile(r"^\s*(in[0-9]+)\s*=\s*torch\.(rand|randint)\((.*)\)\s*$", re.M)
_INPUT_RE = re.compile(r'ex\.input\("([^"]+)",\s*ncnn\.Mat\([^)]*?\.numpy\(\)'
                       r'(?:,\s*batch_index=(-?[0-9]+))?\)')
_OUTPUT_RE = re.compile(r'(out[0-9]+)\.numpy\(batch_index=(-?[0-9]+)\)')


def find_pnnx_script(param_path: str) -> str | None:
    """pnnx's generated test script next to `X.ncnn.param` (`X_ncnn.py`)."""
    p = os.fspath(param_path)
    if p.endswith(".ncnn.param"):
        cand = p[: -len(".ncnn.param")] + "_ncnn.py"
        if os.path.isfile(cand):
            return cand
    return None


def read_pnnx_script(path: str) -> tuple[list[InputSpec], dict[str, int]]:
    """The traced input shapes, dtypes and batch_index values pnnx wrote in its `X_ncnn.py`
    (the first `inputshape`), and the batch_index it reads each output with."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for m in _RAND_RE.finditer(text):
        name, kind, args = m.group(1), m.group(2), m.group(3)
        if kind == "rand":
            dims = [a.strip() for a in args.split(",")]
            dims = [d for d in dims if d and not d.startswith("dtype")]
            shapes[name] = (tuple(int(d) for d in dims), "f32")
        else:
            inner = re.search(r"\(([^()]*)\)", args)
            if inner is None:
                continue
            dims = [d.strip() for d in inner.group(1).split(",") if d.strip()]
            shapes[name] = (tuple(int(d) for d in dims), "i32")
    bidx = {m.group(1): int(m.group(2)) if m.group(2) else NO_BATCH
            for m in _INPUT_RE.finditer(text)}
    specs = [InputSpec(name, shp, dt, bidx.get(name)) for name, (shp, dt) in
             sorted(shapes.items(), key=lambda kv: int(kv[0][2:]))]
    outs = {m.group(1): int(m.group(2)) for m in _OUTPUT_RE.finditer(text)}
    return specs, outs


# =========================================================================== reference

@dataclass
class Reference:
    """Inputs and torch outputs at one set of shapes. `outputs` maps ncnn output blob →
    torch shape; batch indices may be unknown (None)."""

    inputs: list[InputSpec]
    outputs: dict[str, tuple[int, ...]]
    output_batch: dict[str, int] = field(default_factory=dict)
    path: str | None = None
    output_keys: dict[str, str] = field(default_factory=dict)  # output blob -> npz key

    @classmethod
    def load(cls, path: str, graph: "Graph", pnnx: "PnnxGraph | None" = None) -> "Reference":
        """Read a reference `.npz`: keys `in0`…/`out0`… (blob names, with optional
        `batch_index_<blob>` scalars), or `input_<name>`/`output_<name>`, which are paired
        with the graph's inputs and outputs through pnnx's traced shapes (rank, fixed sizes,
        int/float); arrays with identical shapes are interchangeable for a shape check.
        An io side file (`X.ref.io.json`, `read_io_sidefile`) pairs the keys with the blobs
        and gives every batch axis instead. Raises ValueError when the arrays cannot be
        paired."""
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
        ins = sorted(graph.inputs, key=_in_key)
        outs = _ordered_outputs(graph)
        bidx = {k[len("batch_index_"):]: int(v) for k, v in data.items()
                if k.startswith("batch_index_")}
        io = read_io_sidefile(path)
        in_keys = [k for k in data if k in ins]
        if io is not None:  # the side file pairs keys with blobs and says every batch axis
            in_map = {e["blob"]: e["key"] for e in io["inputs"] if e["key"] in data}
            out_map = {e["blob"]: e["key"] for e in io["outputs"] if e["key"] in data}
            for e in io["inputs"] + io["outputs"]:
                bidx.setdefault(e["blob"], int(e["batch_index"]))
        elif in_keys:
            in_map = {k: k for k in in_keys}
            out_map = {k: k for k in data if k in outs}
        else:
            ik = [k for k in data if k.startswith("input_")]
            ok = [k for k in data if k.startswith("output_")]
            if pnnx is None:
                raise ValueError(f"{path}: input_*/output_* arrays can only be paired with the "
                                 f"graph's blobs through pnnx's traced shapes (.pnnx.param)")
            in_map = _pair(ins, [o for o in pnnx.inputs], ik, data, path)
            out_map = _pair(outs, [o for o in pnnx.outputs], ok, data, path)
        specs = []
        for blob, key in in_map.items():
            arr = np.asarray(data[key])
            dt = "i32" if arr.dtype.kind in "iub" else "f32"
            arr = np.ascontiguousarray(arr.astype(np.int32 if dt == "i32" else np.float32))
            b = bidx.get(blob, bidx.get(key))
            specs.append(InputSpec(blob, tuple(arr.shape), dt, b, arr))
        specs.sort(key=lambda s: ins.index(s.blob))
        outputs = {blob: tuple(np.asarray(data[key]).shape) for blob, key in out_map.items()}
        out_b = {blob: bidx[blob] for blob in outputs if blob in bidx}
        return cls(specs, outputs, out_b, path, dict(out_map))

    @classmethod
    def from_arrays(cls, inputs: "dict[str, tuple[np.ndarray, int | None]]",
                    outputs: "dict[str, tuple[int, ...]]", path: str | None = None) -> "Reference":
        """A reference from arrays: `inputs` blob → (array, batch_index or None),
        `outputs` blob → torch shape."""
        specs = []
        for blob, (arr, b) in inputs.items():
            arr = np.asarray(arr)
            dt = "i32" if arr.dtype.kind in "iub" else "f32"
            arr = np.ascontiguousarray(arr.astype(np.int32 if dt == "i32" else np.float32))
            specs.append(InputSpec(blob, tuple(arr.shape), dt, b, arr))
        return cls(specs, {k: tuple(v) for k, v in outputs.items()}, {}, path)


def _fits(arr: np.ndarray, operand: "Operand") -> bool:
    shp = operand.shape
    if shp is None or len(shp) != arr.ndim:
        return False
    if any(d is not None and d != a for d, a in zip(shp, arr.shape)):
        return False
    if operand.dtype:
        return (arr.dtype.kind in "iub") == operand.is_int
    return True


def _pair(blobs: list[str], operands: list["Operand"], keys: list[str],
          data: dict[str, np.ndarray], path: str) -> dict[str, str]:
    """blob → npz key, pairing each array with a pnnx operand its shape fits (backtracking;
    arrays of equal shape and kind are interchangeable)."""
    if len(keys) > len(blobs) or len(blobs) != len(operands):
        raise ValueError(f"{path}: {len(keys)} arrays for {len(blobs)} blobs")
    cand = [[j for j, o in enumerate(operands) if _fits(np.asarray(data[k]), o)] for k in keys]
    used: dict[int, int] = {}

    def go(i: int) -> bool:
        if i == len(keys):
            return True
        for j in cand[i]:
            if j not in used:
                used[j] = i
                if go(i + 1):
                    return True
                del used[j]
        return False

    if not go(0):
        raise ValueError(f"{path}: the arrays do not fit the traced shapes of the graph's "
                         f"inputs/outputs")
    return {blobs[j]: keys[i] for j, i in used.items()}


# what reading a broken reference `.npz` raises (empty file: EOFError; not a zip:
# BadZipFile; a pickle: ValueError)
REFERENCE_ERRORS = (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile)


def io_sidefile(reference: str) -> str:
    """Where a reference's io side file is: `X.ref.io.json` for `X.ref.npz`."""
    return (reference[: -len(".npz")] if reference.endswith(".npz") else reference) + ".io.json"


def read_io_sidefile(reference: str) -> dict[str, list[dict[str, Any]]] | None:
    """The io record next to a reference (`X.ref.io.json`), in the fixture manifest's `io`
    form: `{"inputs": [{"blob": "in2", "key": "input_cos", "batch_index": 1}, ...],
    "outputs": [...]}` (batch_index 233 = none). None when there is no side file; a side
    file that is not such a record raises ValueError."""
    import json

    side = io_sidefile(os.fspath(reference))
    if not os.path.isfile(side):
        return None
    try:
        with open(side, encoding="utf-8") as fh:
            io = json.load(fh)
        for part in ("inputs", "outputs"):
            for e in io[part]:
                if not (isinstance(e["blob"], str) and isinstance(e["key"], str)):
                    raise TypeError("blob and key are strings")
                int(e["batch_index"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{side}: not an io record ({{'inputs': [{{blob, key, "
                         f"batch_index}}], 'outputs': [...]}}): {exc}") from None
    return {"inputs": list(io["inputs"]), "outputs": list(io["outputs"])}


def write_io_sidefile(reference: str, io: Mapping[str, Any]) -> str:
    """Write `io` (the manifest's record: inputs/outputs of blob, key, batch_index) as the
    reference's side file, atomically; returns its path."""
    import json

    from paramsurgery.core.fs import atomic_write

    side = io_sidefile(os.fspath(reference))
    record = {part: [{k: e[k] for k in ("blob", "key", "batch_index", "name") if k in e}
                     for e in io[part]] for part in ("inputs", "outputs")}
    atomic_write(side, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return side


def find_reference(param_path: str) -> str | None:
    """A reference next to the file: `X.ref.npz` for `X.ncnn.param`, or `ref.npz` in the
    same directory."""
    p = os.fspath(param_path)
    stem = p[: -len(".ncnn.param")] if p.endswith(".ncnn.param") else \
        p[: -len(".param")] if p.endswith(".param") else p
    for cand in (stem + ".ref.npz", os.path.join(os.path.dirname(p), "ref.npz")):
        if os.path.isfile(cand):
            return cand
    return None


# =========================================================================== shapes

def _strip(shape: Iterable[int | None]) -> tuple:
    return tuple(d for d in shape if d != 1)


def shape_matches(actual: Sequence[int], expected: Sequence[int | None]) -> bool:
    """Does an ncnn blob shape (torch order, batch `n` possibly leading) fit a torch
    shape pattern (None = any size)? Size-1 dims are ignored on both sides; a None may also
    stand for a dimension that was 1; `n` may sit anywhere."""
    a = _strip(actual)
    e = _strip(expected)
    cands = [a] + [a[1:i] + a[:1] + a[i:] for i in range(2, len(a) + 1)] if a else [a]
    return any(_match(c, e) for c in cands)


def _match(a: tuple, e: tuple) -> bool:
    memo: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        key = (i, j)
        if key in memo:
            return memo[key]
        if j == len(e):
            r = i == len(a)
        elif e[j] is None:
            r = (i < len(a) and go(i + 1, j + 1)) or go(i, j + 1)
        else:
            r = i < len(a) and a[i] == e[j] and go(i + 1, j + 1)
        memo[key] = r
        return r

    return go(0, 0)


def fmt_shape(shape: Iterable[int | None]) -> str:
    return "(" + ",".join("?" if d is None else str(d) for d in shape) + ")"


