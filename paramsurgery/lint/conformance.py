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
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING


from paramsurgery.core import progress
from paramsurgery.core.ncnn import AUTO_SLICE
from paramsurgery.formats.pnnx_mapping import ordered_outputs as _ordered_outputs, map_blobs
from paramsurgery.core.layer_types import is_ncnn_layer
from paramsurgery.core.ncnn import NO_BATCH
from paramsurgery.formats.pnnx_reference import InputSpec, fmt_shape

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import Operand
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer
    from paramsurgery.lint.context import LintContext



# =========================================================================== runs

# run failures a layer causes (a crash or an extraction that fails), which `_locate` finds
_LOCATABLE = ("crash", "extract_failed")

@dataclass
class Run:
    kind: str  # "traced" | "given" | "reference" | "probe"
    inputs: list[InputSpec]
    status: str = "not run"
    message: str = ""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    expected_outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    layout: list[int] = field(default_factory=list)  # the batch axes of the last try
    culprit: str | None = None  # a failed run: the first layer (file order) that fails

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
            if isinstance(v, list) and not lay.params.get(2) and sum(1 for s in v if s == AUTO_SLICE) >= 2:
                out.append(lay)
        return out

    # ------------------------------------------------------------------ planning
    def _traced_specs(self) -> tuple[list[InputSpec] | None, str]:
        from paramsurgery.analysis.traced_inputs import traced_input_specs

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
                return f"it is structurally broken ({f.code}: running it would crash)"
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
            # each run is a child process: run them side by side. A run can take seconds
            # on a real-size model: the bar moves per finished run (no line: the findings
            # are the report)
            from concurrent.futures import ThreadPoolExecutor

            def one(job: tuple[str, list[InputSpec]]) -> Run:
                r = self._run(param, binp, job[0], job[1], fetch)
                task.done()
                return r

            with progress.task("lint --run", total=len(jobs), unit="run") as task, \
                    ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as ex:
                runs = list(ex.map(one, jobs))
                for r in runs:
                    if r.kind == "reference" and ref is not None:
                        r.expected_outputs = dict(ref.outputs)
                    self.runs.append(r)
            for r in self.runs:
                if r.status in _LOCATABLE and r.kind != "probe" and not r.guessed:
                    self._locate(param, binp, r)
            probe = self._probe_specs()
            if probe is not None:
                with progress.task("lint --run probe", total=1, unit="run") as task:
                    self.runs.append(self._run(param, binp, "probe", probe, fetch))
                    task.done()
        return self

    def _run(self, param: str, binp: str | None, kind: str, specs: list[InputSpec],
             fetch: list[str]) -> Run:
        """One child-process run; blobs come back in ncnn's own layout (torch order of
        the Mat dims, `n` leading when it is not 1)."""
        from paramsurgery.runtime.child import Feed, Fetch, RunOptions, run_isolated

        run = Run(kind, list(specs))
        fetches = [Fetch(b, NO_BATCH) for b in fetch]
        for layout in _layouts(specs):
            run.layout = list(layout)
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

    def _locate(self, param: str, binp: str | None, run: Run) -> None:
        """Which layer a failed run fails at (PS404 names it): the smallest k such that
        extracting the tops of the first k layers (file order: pnnx writes them in
        topological order, so those k layers are exactly what ncnn computes) fails too.
        Failing is monotone in k, so a bisection takes log2(layers) child runs."""
        from paramsurgery.runtime.child import Feed, Fetch, RunOptions, run_isolated

        layers = [lay for lay in self.ctx.graph if lay.outputs and lay.type != "Input"]
        if not layers:
            return
        feeds = {s.blob: Feed(s.make_array(i), b)
                 for i, (s, b) in enumerate(zip(run.inputs, run.layout))}

        def fails(k: int) -> bool:
            fetch = [Fetch(b, NO_BATCH) for lay in layers[:k + 1] for b in lay.outputs]
            res = run_isolated(param, binp, feeds, fetch,
                               RunOptions(light_mode=False, num_threads=1),
                               timeout=self.ctx.options.timeout)
            return res.status in _LOCATABLE

        lo, hi = 0, len(layers) - 1
        if not fails(hi):  # every top computes: the failure is not one layer's
            return
        while lo < hi:
            mid = (lo + hi) // 2
            if fails(mid):
                hi = mid
            else:
                lo = mid + 1
        run.culprit = layers[lo].name

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
    fixed = [(i, s) for i, s in enumerate(slices[:len(parts)]) if s != AUTO_SLICE]
    auto_idx = [i for i, s in enumerate(slices[:len(parts)]) if s == AUTO_SLICE]
    if len(auto_idx) < 2 or any(parts[i] != s for i, s in fixed):
        return None
    rest = ins[ax] - sum(s for _, s in fixed)
    sem = "chunk" if layer.name.startswith("chunk") else "tensor_split"
    want = torch_parts(rest, len(auto_idx), sem)
    got = [parts[i] for i in auto_idx]
    if len(want) != len(got) or want == got:
        return None
    return SplitReport(ins[ax], got, want, sem)
