"""PS4xx: traced-shape conformance. The static rules read pnnx's `.pnnx.param`; the run
rules execute the graph through ncnn (see conformance.py) and compare blob shapes with
pnnx's traced shapes and with a torch reference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from paramsurgery.core.findings import Finding
from paramsurgery.formats.pnnx_reference import fmt_shape, shape_matches
from paramsurgery.lint.conformance import torch_parts, uneven_split
from paramsurgery.lint.registry import ERROR, INFO, WARNING, Hit, rule

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer
    from paramsurgery.formats.pnnx_param import Op
    from paramsurgery.lint.conformance import Run
    from paramsurgery.lint.context import LintContext


# run statuses that say something about the graph (not about the harness or the machine)
_GRAPH_FAILURES = ("crash", "extract_failed", "input_failed")


def _where_layer(ctx: "LintContext", blob: str) -> str:
    p = ctx.producer(blob)
    return f"{p.type} {p.name!r}" if p is not None else "?"


def _run_hit(layer: "Layer | None", message: str, run: "Run") -> Hit:
    """A finding of a run: a warning, saying so, when the run's batch axes were guessed."""
    if not run.guessed:
        return Hit(layer, message, severity=ERROR)
    return Hit(layer, message + " (batch axes guessed: give --input-shape [..]f32@k to make "
                                "this exact)", severity=WARNING)


@rule("PS400", "conformance-skipped", INFO, "the conformance run could not be done",
      also=(WARNING,))
def conformance_skipped(ctx: "LintContext") -> Iterator[Hit]:
    """Says why the PS4xx run rules did not run when pnnx's IR or a reference is
    available: no concrete input shapes for a dynamic export, layers ncnn cannot load (the
    PS0xx errors say which), weights too big to synthesise, runs disabled. Also reports a
    probe run (an untraced length chosen to split an automatic Slice unevenly) that ncnn
    could not complete; that is not a finding against the graph. A reference `.npz` that
    cannot be read (empty, not a zip, arrays that do not pair) is a warning here."""
    if ctx.extra.get("reference_error"):
        yield Hit(None, f"reference not used: {ctx.extra['reference_error']}",
                  severity=WARNING)
    if ctx.options.run is True and ctx.pnnx is None and ctx.reference is None \
            and not ctx.input_shapes:  # asked to run (--run) with nothing to run at
        why = ("--inputshape has a symbolic dim or misses an input (give numbers for every "
               "input)" if ctx.inputshape else "no input shapes")
        yield Hit(None, f"not run: {why}, no .pnnx.param / X_ncnn.py next to the file and no "
                        f"reference (--input-shape '[1,4,10]f32,...', --inputshape NAME=[..] "
                        f"with numbers, or --reference REF.npz)")
        return
    if not ctx.can_run or (ctx.pnnx is None and ctx.reference is None
                           and not ctx.input_shapes):
        return
    conf = ctx.conformance.execute()
    if conf.skipped and "disabled" not in conf.skipped:
        yield Hit(None, f"shape conformance not checked: {conf.skipped}")
    for run in conf.runs:
        if not run.ok and run.status not in _GRAPH_FAILURES and \
                run.status not in ("load_param_failed", "load_model_failed"):
            yield Hit(None, f"{run.kind} run at {run.describe_inputs()} could not be done: "
                            f"{run.message}")
        elif run.kind == "probe" and not run.ok:
            yield Hit(None, f"probe run at {run.describe_inputs()} did not complete "
                            f"({run.message}); the uneven-split check used the other runs")
        elif not run.ok and run.guessed:
            yield Hit(None, f"{run.kind} run at {run.describe_inputs()} failed "
                            f"({run.message}) with guessed batch axes; give them with "
                            f"--input-shape [..]f32@k")


@rule("PS401", "traced-shape-mismatch", ERROR,
      "a blob's shape differs from the shape pnnx traced for its operand",
      also=(WARNING,), needs=("pnnx", "run"))
def traced_shape_mismatch(ctx: "LintContext") -> Iterator[Hit]:
    """Runs the ncnn graph at the traced input shapes (pnnx's `X_ncnn.py`, a static
    export's inputs, or `--input-shape`) and compares every blob that maps to a pnnx
    operand with that operand's traced shape (`?` matches any size; size-1 dims and the
    position of ncnn's batch axis are ignored). At other shapes (a reference run) only the
    dimensions pnnx saw constant are compared, and only for dynamic exports.

    A mismatch means an ncnn layer computes a different shape than the torch op pnnx
    converted: a dropped or frozen slice/pad, a real axis moved into ncnn's batch `n`, an
    empty `Concat 0=-233`, …"""
    pn = ctx.pnnx
    if pn is None:
        return
    conf = ctx.conformance.execute()
    mapping = conf.mapping
    reported: set[str] = set()
    for run in conf.runs:
        if not run.ok or run.kind == "probe":
            continue
        if run.kind == "reference" and not pn.is_dynamic:
            continue
        bad = {b for b, o in mapping.items() if b in run.shapes and o.shape is not None
               and not shape_matches(run.shapes[b], o.shape)}
        if not bad:
            continue
        # report where a mismatch starts; blobs computed from a mismatched one are counted
        tainted: set[str] = set()
        roots: list[str] = []
        for layer in ctx.layers:
            upstream = any(b in tainted for b in layer.inputs)
            for b in layer.outputs:
                if upstream:
                    tainted.add(b)
                elif b in bad:
                    roots.append(b)
                    tainted.add(b)
        downstream = len(bad) - len(roots)
        for i, blob in enumerate(roots):
            if blob in reported:
                continue
            reported.add(blob)
            operand = mapping[blob]
            actual = run.shapes[blob]
            op = operand.producer
            src = f" ({op.type} {op.name!r}, {pn.path or 'pnnx'}:{op.line})" if op else ""
            more = (f"; {downstream} blob(s) computed from it differ too"
                    if i == 0 and downstream else "")
            yield _run_hit(ctx.producer(blob),
                      f"blob {blob!r} from {_where_layer(ctx, blob)} has ncnn shape {fmt_shape(actual)} "
                      f"at inputs {run.describe_inputs()} but pnnx traced "
                      f"{operand.shape_text()} for operand #{operand.name}{src}{more}", run)


@rule("PS402", "uneven-split", ERROR,
      "an automatic Slice split a length unevenly, unlike torch's chunk/tensor_split",
      also=(WARNING,), needs=("run",))
def uneven_split_run(ctx: "LintContext") -> Iterator[Hit]:
    """`Slice -23300=k,-233,…,-233` (what pnnx writes for `chunk(k)` / `tensor_split(k)`
    of a dynamic axis) gives each part `remaining / parts_left`, so the remainder goes to
    the **last** parts (9 → 4+5); torch gives it to the first (9 → 5+4). Silently wrong at
    every length the split does not divide (pnnx-bugs.md case 2d; pnnx only warns "chunk
    with non-perfect divided size"). Checked on every run; when no run split unevenly, a
    probe run adds 1 to each dynamic input dimension.

    Workaround: explicit slices `x[..., :(T+1)//2]`, `x[..., (T+1)//2:]` (become Crops with
    expressions)."""
    conf = ctx.conformance.execute()
    done: set[int] = set()
    for run in conf.runs:
        if not run.ok:
            continue
        for lay in conf.auto_slices:
            if lay.id in done:
                continue
            rep = uneven_split(lay, run.shapes)
            if rep is None:
                continue
            done.add(lay.id)
            yield _run_hit(lay, f"Slice {lay.name!r} splits length {rep.axis_len} as "
                           f"{'+'.join(map(str, rep.ncnn_parts))}; torch's {rep.semantics} "
                           f"gives {'+'.join(map(str, rep.torch_parts))} (ncnn gives the "
                           f"remainder to the last parts; run at {run.describe_inputs()})", run)


@rule("PS403", "reference-shape-mismatch", ERROR,
      "an output's shape differs from the torch reference", also=(WARNING,),
      needs=("run",))
def reference_shape_mismatch(ctx: "LintContext") -> Iterator[Hit]:
    """Runs the graph at a reference's inputs (`X.ref.npz` / `ref.npz` next to the file,
    or `--reference`: arrays `in0…`/`out0…` or `input_*`/`output_*`) and compares each
    output's shape with torch's. This catches what pnnx's own IR cannot show because pnnx
    already changed it there: the silently deleted `x[..., :-r]` on a dynamic axis (case 3,
    the slice is gone from `X.pnnx.param` too), padding frozen at the trace length in a
    static export run at another length (case 5), uneven chunks (case 2d)."""
    conf = ctx.conformance.execute()
    for run in conf.runs:
        if run.kind != "reference" or not run.ok:
            continue
        for blob, want in run.expected_outputs.items():
            got = run.shapes.get(blob)
            if got is None or shape_matches(got, want):
                continue
            yield _run_hit(ctx.producer(blob),
                      f"output {blob!r} from {_where_layer(ctx, blob)} has ncnn shape {fmt_shape(got)} "
                      f"but torch gives {fmt_shape(want)} at inputs {run.describe_inputs()}", run)


@rule("PS404", "run-failure", ERROR,
      "ncnn crashes or fails at the traced or reference input shapes", needs=("run",))
def run_failure(ctx: "LintContext") -> Iterator[Hit]:
    """The graph loads, but running it at shapes torch ran (the traced input shapes, or a
    reference's) crashes (SIGSEGV, SIGFPE: e.g. a Reduction on the empty output of
    `Concat 0=-233`, a parameterless Slice) or an extraction fails. The finding names the
    first layer (file order) that fails: the smallest k such that extracting the tops of the
    first k layers fails too (bisected, log2(layers) more runs); a graph ncnn cannot load
    names the layer its loader rejects (a bool MemoryData, the layer PS201 names)."""
    conf = ctx.conformance.execute()
    load = [r for r in conf.runs if r.status in ("load_param_failed", "load_model_failed")]
    failed = [r for r in conf.runs if r.status in _GRAPH_FAILURES and r.kind != "probe"
              and not r.guessed]
    if load:
        culprit = _load_culprit(ctx)
        named = f"; {culprit.type} {culprit.name!r} is one it cannot load" if culprit else ""
        yield Hit(culprit, f"ncnn cannot load the graph ({load[0].message}){named}; the "
                           f"PS0xx/PS2xx findings say why")
        return
    if failed:
        what = "; ".join(f"{r.message} at the {r.kind} inputs {r.describe_inputs()}"
                         for r in failed)
        culprit_name = next((r.culprit for r in failed if r.culprit), None)
        culprit = ctx.graph.find(culprit_name) if culprit_name else None
        named = (f"; the first layer that fails is {culprit.type} {culprit.name!r} (the "
                 f"layers before it compute)") if culprit is not None else ""
        yield Hit(culprit, f"ncnn fails when the graph runs: {what}{named}")


def _load_culprit(ctx: "LintContext") -> "Layer | None":
    """A layer ncnn's loader rejects: one with pnnx's bool load type (PS020), or the layer
    where the weights stop adding up (PS201)."""
    from paramsurgery.formats.weights.binfile import PNNX_BOOL_LOAD_TYPE
    from paramsurgery.lint.rules_weights import bin_layout

    for cand in ctx.layers:
        if cand.type == "MemoryData" and cand.params.get(21, 1) == PNNX_BOOL_LOAD_TYPE:
            return cand
    if ctx.bin:
        for hit in bin_layout(ctx):
            if hit.layer is not None and not isinstance(hit.layer, str):
                return hit.layer
    return None


@rule("PS405", "rope-4d", ERROR, "RotaryEmbed receives a 4-D blob (only one head rotated)",
      also=(WARNING,), needs=("run",))
def rope_4d(ctx: "LintContext") -> Iterator[Hit]:
    """`RotaryEmbed` handles `[w=head_dim, h=seq, c=heads]`; given a 4-D blob (pnnx
    inferred no batch axis, so a torch `(1, H, T, D)` stays 4-D) it rotates one "head" and
    leaves the rest uninitialised (pnnx-bugs.md case 6a). Checked on the runs."""
    conf = ctx.conformance.execute()
    done: set[int] = set()
    for run in conf.runs:
        if not run.ok:
            continue
        for lay in ctx.graph.by_type("RotaryEmbed"):
            if lay.id in done or not lay.inputs:
                continue
            shp = run.shapes.get(lay.inputs[0])
            if shp is not None and len(shp) == 4 and shp[0] == 1:
                done.add(lay.id)
                yield _run_hit(lay, f"RotaryEmbed {lay.name!r} receives a 4-D blob {fmt_shape(shp)} "
                               f"at inputs {run.describe_inputs()}: it rotates only the first "
                               f"head", run)


# --------------------------------------------------------------------------- static, pnnx IR

_FREEZING = ("F.pad", "Tensor.reshape", "Tensor.view", "Tensor.expand", "torch.cat",
             "Tensor.repeat", "F.interpolate", "torch.stack")


def _pnnx_finding(ctx: "LintContext", op: "Op", code: str, severity: str, message: str,
                  fix: str | None = None) -> Finding:
    return Finding(code, severity, message, op.name, op.line,
                   ctx.pnnx.path if ctx.pnnx is not None else None, fix)


@rule("PS410", "frozen-shape", WARNING,
      "pnnx traced a fixed size where the input is dynamic (frozen at the trace length)",
      needs=("pnnx",))
def frozen_shape(ctx: "LintContext") -> Iterator[Finding]:
    """In a dynamic export, an op that passes its input's length through (pad, reshape,
    expand, cat, repeat, interpolate) but whose traced output has only fixed sizes while its
    input has a `?`: the size was computed from the trace length with Python arithmetic
    (`math.ceil(x.shape[-1] / s)`, `int(...)`) that `torch.jit.trace` records as a constant
    (pnnx-bugs.md case 5: `F.pad` output `(1,4,12)` for every length). Reported at the
    op's line in the `.pnnx.param`."""
    pn = ctx.pnnx
    if pn is None or not pn.is_dynamic:
        return
    for op in pn.ops:
        if op.type not in _FREEZING:
            continue
        ins = [pn.operands[i] for i in op.inputs if i in pn.operands]
        outs = [pn.operands[o] for o in op.outputs if o in pn.operands]
        if not outs or not any(o.dynamic for o in ins if o.shape is not None):
            continue
        if all(o.shape is not None and not o.dynamic for o in outs):
            dyn = next(o for o in ins if o.dynamic)
            yield _pnnx_finding(ctx, op, "PS410", WARNING,
                                f"{op.type} {op.name!r} turns dynamic {dyn.shape_text()} into "
                                f"fixed {outs[0].shape_text()}: a size computed from the trace "
                                f"length was recorded as a constant")


_SPLITS = ("torch.chunk", "torch.tensor_split")


@rule("PS411", "uneven-split-traced", WARNING,
      "chunk/tensor_split into automatic parts of a dynamic or non-divisible traced length",
      needs=("pnnx",), also=(ERROR,))
def uneven_split_traced(ctx: "LintContext") -> Iterator[Hit | Finding]:
    """pnnx converts `chunk(k)` / `tensor_split(k)` to `Slice -23300=k,-233,…` (ncnn:
    remainder to the last parts; torch: to the first). From pnnx's traced shapes: when the
    split length is dynamic (`?`) the split is wrong at every length `k` does not divide
    (warning; PS402 proves it on a run); when a fixed traced length does not divide, it is
    wrong at the traced shape (error)."""
    pn = ctx.pnnx
    if pn is None:
        return
    conf = ctx.conformance
    mapping = conf.mapping
    by_op: dict[int, "Layer"] = {}
    for auto in conf.auto_slices:
        for b in auto.outputs:
            o = mapping.get(b)
            if o is not None and o.producer is not None:
                by_op[id(o.producer)] = auto
    if not conf.auto_slices:
        return
    for op in pn.ops:
        if op.type not in _SPLITS:
            continue
        k = op.param("chunks") if op.type == "torch.chunk" else op.param("sections")
        if not isinstance(k, int) or k < 2:
            if op.type == "torch.tensor_split" and op.param("indices") is None:
                k = len(op.outputs)
            else:
                continue
        dim = op.param("dim", 0)
        src = pn.operands.get(op.inputs[0]) if op.inputs else None
        if src is None or src.shape is None or not isinstance(dim, int) or \
                not -len(src.shape) <= dim < len(src.shape):
            continue
        n = src.shape[dim]
        sem = "chunk" if op.type == "torch.chunk" else "tensor_split"
        lay = by_op.get(id(op))
        if n is None:
            msg = (f"{op.type} {op.name!r} splits a dynamic length (dim {dim} of "
                   f"{src.shape_text()}) into {k} automatic parts: ncnn gives the remainder "
                   f"to the last parts, torch to the first, so the outputs differ whenever "
                   f"{k} does not divide the length")
            sev = WARNING
        elif n % k:
            msg = (f"{op.type} {op.name!r} splits traced length {n} into {k} parts: torch "
                   f"gives {'+'.join(map(str, torch_parts(n, k, sem)))}, ncnn's automatic "
                   f"Slice gives {'+'.join(map(str, _ncnn_parts(n, k)))}")
            sev = ERROR
        else:
            continue
        if lay is not None:
            yield Hit(lay, f"Slice {lay.name!r}: {msg}", severity=sev)
        else:
            yield _pnnx_finding(ctx, op, "PS411", sev, msg)


def _ncnn_parts(n: int, k: int) -> list[int]:
    parts = []
    left = n
    for i in range(k):
        p = left // (k - i)
        parts.append(p)
        left -= p
    return parts


@rule("PS412", "stale-shape-hint", WARNING,
      "a -23330 shape hint disagrees with the shape the layer computes")
def stale_shape_hint(ctx: "LintContext") -> Iterator[Hit]:
    """ncnnoptimize writes each layer's output shapes as `-23330=4,dims,w,h,c` hints and
    ncnn plans memory and picks pipelines from them; an edit that changed a shape without
    refreshing the hints (by hand, or a tool that does not know them) leaves them stale.
    Checked against the static shape analysis from the Input layers' own shapes (or
    `--inputshape`). Fix: `paramsurgery shapes FILE --write-hints --in-place`."""
    from paramsurgery.analysis.shapes.hints import has_hints
    from paramsurgery.analysis.shapes.shapemap import ShapeMap

    if not has_hints(ctx.graph):  # a text scan: no analysis for the (many) unhinted files
        return
    for lid, blob, hinted, computed in ctx.shapes.hint_conflicts:
        layer = ctx.graph.layer(lid)
        yield Hit(layer, f"{layer.type} {layer.name!r}: the -23330 hint of {blob!r} says "
                         f"{ShapeMap.format_shape(hinted)}, the layer computes "
                         f"{ShapeMap.format_shape(computed)}")
