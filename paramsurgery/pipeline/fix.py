"""The fix driver: lint a graph, run every repair pass its findings call for (each pass
declares in its own file whether and how `fix` runs it: `repair_order`, `for_fix`,
`claims`), re-lint, and repeat while a new pass is called for; then a header ncnn fails on is
recomputed and, given pnnx's IR or a reference, lint's rules that run the result through
ncnn. `paramsurgery fix` (commands/fix.py) is this driver plus files, flags and verification.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.core.findings import ERROR, WARNING, Finding
from paramsurgery.formats.pnnx_param import PnnxGraph
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import (FixInput, Pass, PassResult, RepairContext, repairs,
                                      resolved)
from paramsurgery.pipeline.manager import PassManager


def fix_inputs() -> dict[str, FixInput]:
    """The extra inputs the repairs declare (`Pass.fix_inputs`), one flag each."""
    out: dict[str, FixInput] = {}
    for cls in repairs():
        for inp in cls.fix_inputs:
            out.setdefault(inp.flag, inp)
    return out


def lint_findings(g: Graph, traced: str | PnnxGraph | None = None) -> list[Finding]:
    """What `fix` acts on: the default lint rules on the graph alone, and, given pnnx's
    `.pnnx.param` (a path or its parsed IR), the repairable rules that read only it (no ncnn
    run; the first call skips them, lacking their input): PS016's frozen trace length leaves
    no layer ncnn lacks, so only pnnx's record of the trace shows it."""
    from paramsurgery.lint import lint_graph
    from paramsurgery.lint.catalogue import all_rules

    found = list(lint_graph(g))
    if traced is not None:
        static = [r.code for r in all_rules().values()
                  if r.fix_pass and r.needs == frozenset({"pnnx"})]
        found += lint_graph(g, pnnx_param=traced, select=static, run=False)
    return found


@dataclass
class FixReport:
    graph: Graph
    before: list[Finding]
    after: list[Finding]
    results: list[PassResult] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    wanted: list[str] = field(default_factory=list)
    # each refusal as `file:line: pass: refused (rolled back): why`, for stderr
    located: list[str] = field(default_factory=list)

    @property
    def fixable_left(self) -> list[Finding]:
        """Findings a repair pass is named for but did not repair."""
        names = {p.name for p in repairs()}
        return [f for f in self.after if f.fix_pass in names]

    @property
    def unrepairable(self) -> list[Finding]:
        names = {p.name for p in repairs()}
        return [f for f in self.after
                if f.fix_pass not in names and f.severity in (ERROR, WARNING)]

    @property
    def errors_left(self) -> list[Finding]:
        """Error findings on the result: what ncnn would still fail on or compute wrong."""
        return [f for f in self.after if f.severity == ERROR]

    @property
    def modified(self) -> bool:
        return any(r.modified for r in self.results)

    @property
    def exit_code(self) -> int:
        if self.failures:
            return 2
        return 1 if any(f.severity == ERROR for f in self.after) else 0


def fix_graph(g: Graph, *, traced: str | os.PathLike | None = None,
              traced_len: int | None = None, pair: str | os.PathLike | None = None,
              param: str | os.PathLike | None = None, bin: str | os.PathLike | None = None,
              reference: str | os.PathLike | None = None,
              options: dict[str, object] | None = None, run: bool = True) -> FixReport:
    """Lint `g`, run the repairs the findings (and the given inputs) call for, re-lint;
    repeated while the findings call for a pass that has not run yet. A header ncnn fails
    on (PS101/PS102) is recomputed. Then, with pnnx's IR or a reference (and `run`), lint's
    rules that run the result through ncnn. `options`: values of the passes' `fix_inputs`
    by name."""
    applied: list[type[Pass]] = []  # the repairs that changed the graph, in order
    given = dict(options or {})
    if traced_len is not None:  # the Python API's names for dynamize's declared inputs
        given["traced_len"] = traced_len
    if pair is not None:
        given["pair"] = _path(pair)
    ctx = RepairContext(_path(traced), weights=any(layer.weights for layer in g),
                        param=_path(param), bin=_path(bin), reference=_path(reference),
                        options=given,
                        repaired_like=lambda p, b, t: _repaired_like(applied, p, b, t))
    # pnnx's IR, read once for every lint round and every pass (both only read it)
    pnnx_ir = ctx.pnnx
    before = lint_findings(g, pnnx_ir)
    found = before
    current = g
    done: set[str] = set()
    results: list[PassResult] = []
    failures: list[tuple[str, str]] = []
    located: list[str] = []
    while True:
        asked = {f.fix_pass for f in found if f.fix_pass}
        plan = []
        for cls in repairs():
            if cls.name in done:
                continue
            try:
                pass_ = cls.for_fix(ctx, cls.name in asked)
            except ParamSurgeryError as exc:
                done.add(cls.name)
                failures.append((cls.name, exc.message))
                located.append(_located(cls.name, exc, param))
                continue
            if pass_ is not None:
                done.add(cls.name)
                plan.append(pass_)
        if not plan:
            break
        for pass_ in plan:  # one at a time: a later pass may replay the earlier ones
            manager = PassManager([pass_], early_stop=False)
            current, ran, refused = manager.run(current)
            located += [_located(pass_.name, exc, param) for exc in manager.refusals]
            results += ran
            failures += refused
            applied += [type(pass_) for r in ran if r.modified]
        found = lint_findings(current, pnnx_ir)
    if not failures and any(_bad_header(f) for f in found):
        header = rewrite_header(current)
        results.append(header)
        current = header.graph
        found = lint_findings(current, pnnx_ir)
    if run:  # lint's rules that run the graph through ncnn, on the result
        found += run_findings(current, ctx, pnnx_ir)
    wanted = [p.name for p in repairs() if p.name in done]
    if any(r.pass_name == HEADER for r in results):
        wanted.append(HEADER)
    return FixReport(current, before, found, results, failures, wanted, located)


HEADER = "header"  # fix's own repair of PS101/PS102: the counts recomputed (fmt's header)


def _bad_header(f: Finding) -> bool:
    """A header ncnn fails on (PS101 fewer layers than declared, PS102 too few blobs); a
    header declaring fewer layers than the body (PS101 warning) is kept: ncnn ignores the
    rest, and raising the count could load layers that were never meant to."""
    return f.severity == ERROR and f.code in ("PS101", "PS102")


def rewrite_header(g: Graph) -> PassResult:
    """The graph with its header counts recomputed when written (what `fmt` does to the
    header; the layers stay as written)."""
    from paramsurgery.core.changes import Change
    from paramsurgery.formats.param_text import write_param

    src = g.source
    before = f"{src.declared_layers} {src.declared_blobs}"
    out = g.copy().mark_modified()
    head = write_param(out).split(b"\n", 2)[1].decode()
    return PassResult(out, True, [Change("header", "layer and blob counts", before, head)],
                      pass_name=HEADER)


def run_findings(g: Graph, ctx: RepairContext, pnnx_ir: PnnxGraph | None) -> list[Finding]:
    """Lint's error rules that run the graph through ncnn (PS401-PS405, and PS400 saying
    why they could not), on the repaired graph, with what fix was given: pnnx's IR, the
    reference, the weights."""
    from paramsurgery.lint import lint_graph
    from paramsurgery.lint.catalogue import all_rules

    if pnnx_ir is None and ctx.reference is None:
        return []
    codes = [r.code for r in all_rules().values()
             if "run" in r.needs and (r.severity == ERROR or ERROR in r.severities)]
    return lint_graph(g, pnnx_param=pnnx_ir, reference=ctx.reference,
                      select=codes + ["PS400"], run=True, run_bin=ctx.bin, path=ctx.param)


def _located(name: str, exc: ParamSurgeryError, param: str | os.PathLike | None) -> str:
    """A refusal as one `file:line: ...` line: the layer's place when the pass named it,
    else the input file."""
    where = exc.location()
    if exc.file is None and param is not None:  # `<input>`: the file fix was given
        where = os.fspath(param) + where[len("<input>"):]
    message = exc.message
    if message.startswith(where + ":"):  # a postcondition's message is located already
        message = message[len(where) + 1:].lstrip()
    return f"{where}: {name}: refused (rolled back): {message}"


def _path(p: str | os.PathLike | None) -> str | None:
    return os.fspath(p) if p is not None else None


def _repaired_like(applied: list[type[Pass]], param: str, bin: str | None,
                   traced: str | None) -> Graph:
    """Another export of the same model after the repairs applied so far (each built for
    that file, as `fix` would): what a pass compares the input with, like for like."""
    from paramsurgery.core.errors import PassRefused
    from paramsurgery.formats.io import load

    other = load(param, bin=bin)
    ctx = RepairContext(traced, weights=bin is not None, param=param, bin=bin,
                        compare_only=True)
    for cls in applied:
        pass_ = cls.for_fix(ctx, True)
        if pass_ is None:
            continue
        try:
            other = resolved(pass_)(other).graph
        except ParamSurgeryError as exc:
            raise PassRefused(f"{param}: {cls.name} does not repair it like the input: "
                              f"{exc.message}") from None
    return other
