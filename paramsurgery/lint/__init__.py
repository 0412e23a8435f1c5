"""`paramsurgery lint`: find what pnnx got wrong before ncnn does.

    from paramsurgery.lint import lint_file, lint_graph, RULES
    findings = lint_file("talker.ncnn.param")            # .pnnx.param / X_ncnn.py / ref.npz
    for f in findings:                                   #   next to it are used if present
        print(f.format())
    lint_graph(g, bin="m.bin", pnnx_param="m.pnnx.param", select=["PS0"], ignore=["PS111"])
    get_rule("PS001").fix_pass                           # "fix-slice": what `paramsurgery fix` runs

Rules are data (`registry.py`): one registry, one small function per rule in
`rules_layers.py` (PS0xx), `rules_structure.py` (PS1xx), `rules_weights.py` (PS2xx),
`rules_scale.py` (PS3xx) and `rules_shapes.py` (PS4xx, with `conformance.py`). A rule's doc
string is its `--explain` text.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Sequence

from paramsurgery.core.collector import paused_gc
from paramsurgery.core.findings import ERROR, INFO, WARNING, Finding
from paramsurgery.formats.pnnx_reference import (REFERENCE_ERRORS, InputSpec, Reference, find_reference,
                                                 parse_input_shapes)
from paramsurgery.lint.context import LintContext, LintOptions
from paramsurgery.lint.registry import RULES, Hit, Rule
from paramsurgery.lint.catalogue import all_rules, get_rule, select_rules

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import PnnxGraph
    from paramsurgery.ir.graph import Graph

__all__ = ["lint_graph", "lint_file", "Rule", "RULES", "all_rules", "get_rule", "fix_pass_of",
           "fixable", "LintOptions", "InputSpec", "Reference", "parse_input_shapes",
           "summarize", "SEVERITY_ORDER", "ran_through_ncnn"]

SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}


def lint_graph(graph: "Graph", *, bin: str | os.PathLike | None = None,
               pnnx_param: "str | os.PathLike | PnnxGraph | None" = None,
               select: Iterable[str] | str | None = None,
               ignore: Iterable[str] | str | None = None,
               reference: "str | os.PathLike | Reference | None" = None,
               input_shapes: "Sequence[InputSpec] | str | None" = None,
               run: bool | None = None, run_bin: str | os.PathLike | None = None,
               path: str | None = None,
               options: LintOptions | None = None,
               inputshape: "dict | str | list | None" = None,
               record: "list[LintContext] | None" = None) -> list[Finding]:
    """Every finding of the selected rules on `graph`, sorted by line then code.

    `bin`: the `.bin` to check (PS2xx) and to run with. `pnnx_param`: pnnx's `.pnnx.param`
    (a path or a parsed PnnxGraph) for the PS4xx rules. `reference`: a `.npz` of inputs and
    torch outputs (or a `Reference`). `input_shapes`: the traced input shapes (InputSpecs or
    pnnx syntax `[1,4,10]f32@0,...`). `run`: run through ncnn for PS4xx (None = when there is
    something to compare with). `run_bin`: weights used only for running (not linted).
    `select`/`ignore`: code prefixes. Rules whose inputs are missing are skipped. `record`:
    the run's LintContext is appended (what ran: `ran_through_ncnn(ctx)`)."""
    from paramsurgery.formats.pnnx_param import PnnxGraph, read_pnnx_param

    opts = options or LintOptions()
    if run is not None:
        opts = LintOptions(**{**opts.__dict__, "run": run})
    pn = pnnx_param
    if pn is not None and not isinstance(pn, PnnxGraph):
        pn = read_pnnx_param(pn)
    ref = reference
    ref_error = None
    if ref is not None and not isinstance(ref, Reference):
        ref_path = os.fspath(ref)
        try:
            ref = Reference.load(ref_path, graph, pn)
        except REFERENCE_ERRORS as exc:
            ref, ref_error = None, f"{ref_path}: {exc or type(exc).__name__}"
    specs = input_shapes
    if isinstance(specs, str):
        specs = parse_input_shapes(specs, sorted(graph.inputs))
    ctx = LintContext(graph, path=path, bin=os.fspath(bin) if bin is not None else None,
                      pnnx=pn, reference=ref, input_shapes=specs,
                      run_bin=os.fspath(run_bin) if run_bin is not None else None, options=opts)
    if inputshape:
        from paramsurgery.analysis.shapes import normalize_inputshape

        ctx.inputshape = normalize_inputshape(inputshape)
        if opts.run is True and not ctx.input_shapes:  # asked to run: at these sizes
            ctx.input_shapes = _specs_from_inputshape(graph, ctx.inputshape)
    if ref_error:
        ctx.extra["reference_error"] = ref_error
    if record is not None:
        record.append(ctx)
    return run_rules(ctx, select_rules(select, ignore))


def ran_through_ncnn(ctx: LintContext) -> tuple[list[str], str | None]:
    """What a lint run did with ncnn: (one line per run made, why none was made or None).
    Only what happened: a run that was not made is never reported as made."""
    conf = ctx.__dict__.get("conformance")  # made only when a rule asked for it
    if conf is None or not conf._done:
        if not ctx.can_run:
            return [], "runs are disabled (--no-run)"
        return [], ("nothing to run it at (no .pnnx.param, X_ncnn.py or reference next to "
                    "the file, no input shapes)")
    made = [f"{r.kind} inputs {r.describe_inputs()}: {r.status}" for r in conf.runs]
    return made, (conf.skipped if not made else None)


def _specs_from_inputshape(g: "Graph", shapes: dict) -> list[InputSpec] | None:
    """`--inputshape` sizes as the inputs of a run, when every graph input has one and
    every dim is a number (numpy order, no batch axis; ids an Embed reads as int32)."""
    from paramsurgery.core.ncnn import NO_BATCH

    specs = []
    for blob in g.inputs:
        dims = shapes.get(blob)
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        ids = any(c.type == "Embed" for c in g.consumer_layers(blob))
        specs.append(InputSpec(blob, tuple(dims), "i32" if ids else "f32", NO_BATCH))
    return specs or None


def run_rules(ctx: LintContext, rules: Sequence[Rule]) -> list[Finding]:
    out: list[Finding] = []
    have = {"bin": ctx.bin is not None, "pnnx": ctx.pnnx is not None,
            "run": ctx.can_run and (ctx.pnnx is not None or ctx.reference is not None
                                    or bool(ctx.input_shapes))}
    unread = _unread_layers(ctx.graph)
    with paused_gc():
        for r in rules:
            if any(not have[n] for n in r.needs):
                continue
            for hit in r.check(ctx):
                f = _to_finding(ctx, r, hit)
                if unread and isinstance(hit, Hit) and hit.layer is not None and \
                        id(hit.layer) in unread and f.severity != INFO:
                    f = Finding(f.code, INFO, f"{f.message} (ncnn never reads this layer: it "
                                f"is past the header's layer count)", f.layer, f.line, f.file,
                                f.fix)
                out.append(f)
    out = _drop_covered_loader_findings(out)
    out.sort(key=lambda f: (f.file != ctx.path and f.file is not None,
                            f.line if f.line is not None else 0, f.code))
    return out


def _drop_covered_loader_findings(out: list[Finding]) -> list[Finding]:
    """PS112 (ncnn's loader rejects the file) guarantees an error wherever ncnn rejects; when
    a more specific rule already reports an error at the same place (the same line; for a
    header message, a header finding) it would only repeat it."""
    loader = [f for f in out if f.code == "PS112"]
    if not loader:
        return out
    others = {(f.file, f.line) for f in out if f.severity == ERROR and f.code != "PS112"}
    headers = {f.file for f in out if f.severity == ERROR and f.code != "PS112" and f.line is None}
    drop = {id(f) for f in loader
            if (f.file, f.line) in others or (f.layer is None and f.file in headers)}
    return [f for f in out if id(f) not in drop]


def _unread_layers(g: "Graph") -> set[int]:
    """ids of the layers after the header's layer count in a file as read (ncnn stops
    before them: a finding there is no hazard)."""
    declared = g.source.declared_layers if g.source is not None else None
    if g.modified or declared is None or declared >= len(g):
        return set()
    return {id(layer) for layer in g.layers[declared:]}


def _to_finding(ctx: LintContext, r: Rule, hit: "Hit | Finding") -> Finding:
    if isinstance(hit, Finding):
        if hit.file is None and ctx.path is not None:
            return replace(hit, file=ctx.path)
        return hit
    layer = hit.layer
    if hit.fix is not None or hit.fix_pass is not None:
        fix, fix_pass = hit.fix, hit.fix_pass
    else:
        fix, fix_pass = r.fix, r.fix_pass
    if fix_pass is not None and fix is None:
        fix = f"paramsurgery {fix_pass}"
    return Finding(r.code, hit.severity or r.severity, hit.message,
                   layer.name if layer is not None else None,
                   layer.source_line if layer is not None else hit.line,
                   (layer.source_file if layer is not None and layer.source_file else ctx.path),
                   fix, fix_pass)


def lint_file(path: str | os.PathLike, *, bin: str | os.PathLike | None = None,
              pnnx_param: str | os.PathLike | None = None,
              select: Iterable[str] | str | None = None,
              ignore: Iterable[str] | str | None = None,
              reference: "str | os.PathLike | Reference | None" = None,
              input_shapes: "Sequence[InputSpec] | str | None" = None,
              run: bool | None = None, discover: bool = True,
              options: LintOptions | None = None,
              inputshape: "dict | str | list | None" = None,
              record: "list[LintContext] | None" = None) -> list[Finding]:
    """Load `path` (`.param` or `.param.bin`) and lint it. With `discover` (default), pnnx's
    files next to it are used when not given: `X.pnnx.param`, `X_ncnn.py` (traced input
    shapes), `X.ref.npz`/`ref.npz` (a reference), and `X.ncnn.bin`/`X.bin` to run with.
    Unreadable input raises a ParamSurgeryError with file:line:col."""
    from paramsurgery.formats.pnnx_param import find_pnnx_param
    from paramsurgery.formats.io import load

    from paramsurgery.core.errors import ParamSurgeryError

    p = os.fspath(path)
    if p.endswith(".pnnx.param"):
        raise ParamSurgeryError("this is pnnx's own IR, not an ncnn graph: lint the .ncnn.param "
                                "next to it (its .pnnx.param is read from there)", file=p)
    g = load(p)
    for what, given in (("weights", bin), ("pnnx IR", pnnx_param), ("reference", reference)):
        if given is not None and not isinstance(given, (Reference,)) and \
                not os.path.isfile(os.fspath(given)):
            raise ParamSurgeryError(f"no such file ({what})", file=os.fspath(given))
    pn: "str | os.PathLike | PnnxGraph | None" = pnnx_param
    ref: "str | os.PathLike | Reference | None" = reference
    if reference is not None and not isinstance(reference, Reference):  # read here: a bad
        # reference is an input error
        try:
            from paramsurgery.formats.pnnx_param import read_pnnx_param

            found = pnnx_param if pnnx_param is not None else \
                find_pnnx_param(p) if discover else None
            pn = read_pnnx_param(found) if found is not None else None
            ref = Reference.load(os.fspath(reference), g, pn)
        except REFERENCE_ERRORS as exc:
            raise ParamSurgeryError(f"cannot use this reference: {exc or type(exc).__name__}",
                                    file=os.fspath(reference)) from None
    if discover:
        if pn is None:
            pn = find_pnnx_param(p)
        if ref is None:
            ref = find_reference(p)
    run_bin = None
    if discover and bin is None:
        run_bin = _bin_next_to(p)
    return lint_graph(g, bin=bin, pnnx_param=pn, select=select, ignore=ignore,
                      reference=ref, input_shapes=input_shapes, run=run,
                      run_bin=run_bin, path=p, options=options, inputshape=inputshape,
                      record=record)


def _bin_next_to(p: str) -> str | None:
    from paramsurgery.core.fs import companion

    return companion(p, (".param", ".bin"), (".param.bin", ".bin"))


def fix_pass_of(finding: Finding) -> str | None:
    """The pass that repairs a finding (`fix-slice`, `fix-reduction`, `fold-gqa`, …) or
    None: the pass its rule or check named (`Finding.fix_pass`)."""
    return finding.fix_pass


def fixable(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """Findings grouped by the pass that repairs them (what `paramsurgery fix` runs)."""
    out: dict[str, list[Finding]] = {}
    for f in findings:
        p = fix_pass_of(f)
        if p is not None and p not in ("fmt",):
            out.setdefault(p, []).append(f)
    return out


def summarize(findings: Iterable[Finding]) -> dict[str, int]:
    counts = {ERROR: 0, WARNING: 0, INFO: 0}
    for f in findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    return counts
