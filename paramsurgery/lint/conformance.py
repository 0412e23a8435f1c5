"""Traced-shape conformance: run the ncnn graph and compare blob shapes with what torch
produced.

Sources of truth, each optional:

- pnnx's own IR (`X.pnnx.param`): the traced shape of every operand (`?` = a dimension
  that differed between the two traces of a dynamic export);
- the traced input shapes: pnnx's test script (`X_ncnn.py`, it feeds the first
  `inputshape` with pnnx's `batch_index`), a static export's input operands, or
  `input_shapes` given by the caller;
- a reference (`ref.npz` / `X.ref.npz`): inputs and torch outputs at some length.

Runs go through `paramsurgery.runtime.child.run_isolated` (a child process, fp32 options,
light mode off so intermediates can be extracted) with the real weights when they are
next to the file, else synthetic weights of exactly the right layout
(`paramsurgery.formats.weights.synth`), else none for weightless graphs.

Blob ↔ operand mapping: pnnx renumbers operands when it writes the ncnn graph, so blobs
are paired with operands by structure: graph inputs (`in0` ↔ first `pnnx.Input`), graph
outputs (`out0` ↔ first output of `pnnx.Output`, tuples expanded), and the tops of layers
paired with pnnx ops kind by kind in order (the k-th Convolution1D with the k-th
`nn.Conv1d`), only for kinds whose counts agree on both sides (a fusion changes the count
and drops the kind). A layer's top is followed through the `<name>_ncnnreshape` Reshapes
pnnx adds around it.

Shapes are compared in torch order with size-1 dimensions dropped on both sides (ncnn
drops the batch axis and may keep or drop other 1s) and `?` matching any size; ncnn's
batch `n` may sit at any position.
"""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from paramsurgery.formats.pnnx_mapping import (
    input_key as _in_key,
    ordered_outputs as _ordered_outputs,
    map_blobs,
)
from paramsurgery.core.layer_types import is_ncnn_layer

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import Operand, PnnxGraph
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer
    from paramsurgery.lint.context import LintContext

NO_BATCH = 233


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


# =========================================================================== runs

@dataclass
class Run:
    kind: str  # "traced" | "given" | "reference" | "probe"
    inputs: list[InputSpec]
    status: str = "not run"
    message: str = ""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    expected_outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def guessed(self) -> bool:
        return any(s.guessed for s in self.inputs)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe_inputs(self) -> str:
        return ", ".join(f"{s.blob}{fmt_shape(s.shape)}" for s in self.inputs)


class Conformance:
    """All runs of one lint, done on first use. `skipped` says why nothing ran (or None)."""

    def __init__(self, ctx: "LintContext") -> None:
        self.ctx = ctx
        self.skipped: str | None = None
        self.runs: list[Run] = []
        self._done = False

    # ------------------------------------------------------------------ mapping
    @cached_property
    def mapping(self) -> dict[str, "Operand"]:
        if self.ctx.pnnx is None:
            return {}
        return map_blobs(self.ctx.graph, self.ctx.pnnx)

    @cached_property
    def auto_slices(self) -> list["Layer"]:
        """Slices with two or more automatic (-233) parts (floor-first in ncnn)."""
        out = []
        for lay in self.ctx.graph.by_type("Slice"):
            v = lay.params.get(0)
            if isinstance(v, list) and not lay.params.get(2) and sum(1 for s in v if s == -233) >= 2:
                out.append(lay)
        return out

    # ------------------------------------------------------------------ planning
    def _traced_specs(self) -> tuple[list[InputSpec] | None, str]:
        from paramsurgery.verify.compare.inputs import traced_input_specs

        ctx = self.ctx
        return traced_input_specs(ctx.graph, ctx.path, ctx.pnnx, ctx.input_shapes)

    def _weights(self, tmp: str) -> tuple[str | None, str | None]:
        """(bin path or None, reason to skip)."""
        ctx = self.ctx
        for cand in (ctx.bin, ctx.run_bin):
            if cand and os.path.isfile(cand):
                if _bin_fits(ctx.graph, cand):
                    return cand, None
        from paramsurgery.formats.weights import layer_reads

        total = 0
        try:
            for layer in ctx.graph:
                reads = layer_reads(layer)
                for r in reads or ():
                    total += 4 + 4 * r.count
        except Exception as exc:  # noqa: BLE001 - params ncnn cannot load (other rules say why)
            return None, f"no weights can be made for these params ({exc})"
        if total == 0:
            return None, None
        if total > ctx.options.max_synth_bytes:
            return None, (f"the graph needs {total / 2**20:.0f} MB of weights and none were "
                          f"given (synthetic weights are made up to "
                          f"{ctx.options.max_synth_bytes / 2**20:.0f} MB; pass --bin)")
        from paramsurgery.formats.weights.synth import write_synth_bin

        path = os.path.join(tmp, "synth.bin")
        with open(path, "wb") as fh:
            write_synth_bin(ctx.graph, fh)
        return path, None

    def _param_source(self, tmp: str) -> str:
        from paramsurgery.formats.param_text import dump_bytes

        ctx = self.ctx
        if ctx.path and os.path.isfile(ctx.path) and not ctx.graph.modified and \
                ctx.graph.source.format == "param":
            return ctx.path
        path = os.path.join(tmp, "graph.param")
        with open(path, "wb") as fh:
            fh.write(dump_bytes(ctx.graph))
        return path

    def _blobs_to_fetch(self) -> list[str]:
        g = self.ctx.graph
        want: dict[str, None] = {}
        for b in self.mapping:
            want[b] = None
        for b in _ordered_outputs(g):
            want[b] = None
        for lay in self.auto_slices:
            for b in list(lay.inputs) + list(lay.outputs):
                want[b] = None
        for lay in g.by_type("RotaryEmbed"):
            if lay.inputs:
                want[lay.inputs[0]] = None
        known = g._producers
        return [b for b in want if b in known]

    def loadable(self) -> str | None:
        """Why ncnn cannot load this graph (so no run), or None."""
        for t in self.ctx.graph.types():
            if not is_ncnn_layer(t):
                return f"it has layers ncnn does not have ({t})"
        for f in self.ctx.validate_findings:
            if f.severity == "error":
                return f"it is structurally broken ({f.code})"
        return None

    # ------------------------------------------------------------------ running
    def execute(self) -> "Conformance":
        if self._done:
            return self
        self._done = True
        ctx = self.ctx
        if not ctx.can_run:
            self.skipped = "runs are disabled (--no-run)"
            return self
        traced, kind = self._traced_specs()
        ref = ctx.reference
        if ctx.pnnx is None and ref is None and not traced:
            self.skipped = "no .pnnx.param, reference or input shapes to compare with"
            return self
        if traced is None and ref is None:
            self.skipped = ("the export is dynamic and no concrete input shapes are known "
                            "(keep pnnx's X_ncnn.py next to the file, give --input-shape, or "
                            "a reference .npz)")
            return self
        why = self.loadable()
        if why:
            self.skipped = f"ncnn cannot load the graph: {why}"
            return self
        try:
            import ncnn  # noqa: F401
        except ImportError:
            self.skipped = "the ncnn Python package is not installed"
            return self
        with tempfile.TemporaryDirectory(prefix="paramsurgery-lint-") as tmp:
            binp, why = self._weights(tmp)
            if why:
                self.skipped = why
                return self
            param = self._param_source(tmp)
            fetch = self._blobs_to_fetch()
            jobs: list[tuple[str, list[InputSpec]]] = []
            if traced:
                jobs.append((kind, traced))
            if ref is not None:
                jobs.append(("reference", ref.inputs))
            # each run is a child process: run them side by side
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as ex:
                runs = list(ex.map(lambda j: self._run(param, binp, j[0], j[1], fetch), jobs))
            for r in runs:
                if r.kind == "reference" and ref is not None:
                    r.expected_outputs = dict(ref.outputs)
                self.runs.append(r)
            probe = self._probe_specs()
            if probe is not None:
                self.runs.append(self._run(param, binp, "probe", probe, fetch))
        return self

    def _run(self, param: str, binp: str | None, kind: str, specs: list[InputSpec],
             fetch: list[str]) -> Run:
        """One child-process run; blobs come back in ncnn's own layout (torch order of
        the Mat dims, `n` leading when it is not 1)."""
        from paramsurgery.runtime.child import Feed, Fetch, RunOptions, run_isolated

        run = Run(kind, list(specs))
        fetches = [Fetch(b, NO_BATCH) for b in fetch]
        for layout in _layouts(specs):
            feeds = {s.blob: Feed(s.make_array(i), b)
                     for i, (s, b) in enumerate(zip(specs, layout))}
            res = run_isolated(param, binp, feeds, fetches,
                               RunOptions(light_mode=False, num_threads=1),
                               timeout=self.ctx.options.timeout)
            run.status = res.status
            run.message = res.describe()
            if res.ok:
                run.shapes = {b: tuple(int(d) for d in a.shape) for b, a in res.outputs.items()}
                break
            if res.status in ("load_param_failed", "load_model_failed", "timeout"):
                break
        return run

    def _probe_specs(self) -> list[InputSpec] | None:
        """Input shapes at which an automatic Slice of a dynamic axis splits unevenly, when
        no run so far did: the first run's `?` dims + 1."""
        if not self.auto_slices or not self.runs or self.ctx.pnnx is None:
            return None
        for run in self.runs:
            if run.ok and any(uneven_split(lay, run.shapes) for lay in self.auto_slices):
                return None
        base = next((r for r in self.runs if r.ok), None)
        if base is None:
            return None
        p_ins = self.ctx.pnnx.inputs
        if len(p_ins) != len(base.inputs):
            return None
        specs = []
        changed = False
        for s, o in zip(base.inputs, p_ins):
            shape = list(s.shape)
            if o.shape is not None and len(o.shape) == len(shape):
                for i, d in enumerate(o.shape):
                    if d is None:
                        shape[i] += 1
                        changed = True
            specs.append(InputSpec(s.blob, tuple(shape), s.dtype, s.batch_index))
        return specs if changed else None


def _layouts(specs: list[InputSpec]) -> list[list[int]]:
    """Batch-axis layouts to try: the known ones, or for guessed inputs pnnx's usual
    choices in turn (axis 0 when the leading dim is 1; axis 0 for every rank >= 2 input;
    no batch axis)."""
    first = [s.effective_batch_index() for s in specs]
    if not any(s.guessed for s in specs):
        return [first]
    alts = [first,
            [s.effective_batch_index() if not s.guessed else
             (0 if len(s.shape) >= 2 else NO_BATCH) for s in specs],
            [s.effective_batch_index() if not s.guessed else NO_BATCH for s in specs]]
    out: list[list[int]] = []
    for a in alts:
        if a not in out:
            out.append(a)
    return out


def _bin_fits(graph: "Graph", path: str) -> bool:
    from paramsurgery.core.errors import BinLayoutError
    from paramsurgery.formats.weights import attach_weights

    try:
        attach_weights(graph.copy(), path, allow_trailing=True)
    except (BinLayoutError, OSError):
        return False
    return True


# =========================================================================== uneven split

@dataclass
class SplitReport:
    axis_len: int
    ncnn_parts: list[int]
    torch_parts: list[int]
    semantics: str


def torch_parts(length: int, n: int, semantics: str) -> list[int]:
    """How torch splits `length` into `n` parts: `chunk` (ceil size, last smaller) or
    `tensor_split` (the first `length % n` parts one longer)."""
    if semantics == "chunk":
        size = -(-length // n)
        parts: list[int] = []
        left = length
        while left > 0 and len(parts) < n:
            parts.append(min(size, left))
            left -= parts[-1]
        return parts
    q, r = divmod(length, n)
    return [q + 1 if i < r else q for i in range(n)]


def uneven_split(layer: "Layer", shapes: dict[str, tuple[int, ...]]) -> SplitReport | None:
    """Did this automatic Slice split its axis differently from torch in this run?"""
    if not layer.inputs or layer.inputs[0] not in shapes:
        return None
    ins = shapes[layer.inputs[0]]
    found = [shapes.get(b) for b in layer.outputs]
    outs = [o for o in found if o is not None and len(o) == len(ins)]
    if len(outs) != len(found):
        return None
    axes = [i for i in range(len(ins)) if any(o[i] != ins[i] for o in outs)]
    if len(axes) != 1:
        return None
    ax = axes[0]
    slices = layer.params.get_ints(0) or []
    parts = [o[ax] for o in outs]
    fixed = [(i, s) for i, s in enumerate(slices[:len(parts)]) if s != -233]
    auto_idx = [i for i, s in enumerate(slices[:len(parts)]) if s == -233]
    if len(auto_idx) < 2 or any(parts[i] != s for i, s in fixed):
        return None
    rest = ins[ax] - sum(s for _, s in fixed)
    sem = "chunk" if layer.name.startswith("chunk") else "tensor_split"
    want = torch_parts(rest, len(auto_idx), sem)
    got = [parts[i] for i in auto_idx]
    if len(want) != len(got) or want == got:
        return None
    return SplitReport(ins[ax], got, want, sem)
