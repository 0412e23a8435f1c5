"""`paramsurgery fix FILE`: lint, run every repair pass the findings call for, re-lint, write.

The plan is data: each lint finding names the pass that repairs it (`Finding.fix_pass`, set
by its rule or check), and each pass declares in its own file whether `fix` may run it
(`repair_order`), how (`for_fix`) and which converter leftovers it claims (`claims`, what
lint's PS004 names as the fix). The passes run in a `PassManager`; one that refuses is
rolled back and its reason printed, the others still apply. A repair can make another
finding visible: the plan is rebuilt from the new findings until no new pass is called for
(each pass runs at most once). A pass's extra inputs are its own declaration
(`Pass.fix_inputs`, e.g. dynamize's `--pair`), exposed here as flags and handed over in the
`RepairContext` with the input's `--bin`, its reference and `repaired_like` (another export
after the repairs applied so far, so a pass compares like with like).

With `--bin`, the weights are loaded (and checked against the graph) and the output gets
its `.bin` next to it: rewritten when a repair changed the weighted layers, else a hard link
(or copy) of the input's. `--verify` runs the result through ncnn (child process) against a
torch reference (`X.ref.npz` next to the input, or `--reference`).

What is left afterwards is nothing, or findings no pass repairs (listed, exit 1), or
refusals (exit 2).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.core.findings import ERROR, WARNING, Finding
from paramsurgery.formats.pnnx_param import PnnxGraph, read_pnnx_param
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import FixInput, Pass, PassResult, RepairContext, repairs
from paramsurgery.pipeline.manager import PassManager
from paramsurgery.commands._common import add_output_args
from paramsurgery.commands._runner import (Check, GraphCommand, Outputs, Run, add_bin_arg, add_pnnx_arg,
                                           add_verify_args, traced_path)


def register(sub: argparse._SubParsersAction) -> None:
    names = ", ".join(p.name for p in repairs())
    p = sub.add_parser("fix", help=f"lint, then run every repair pass the findings call for "
                                   f"({names})")
    p.add_argument("param", help="input .param")
    add_output_args(p, "output .param (default: <input>.fixed.param)")
    add_bin_arg(p)
    add_pnnx_arg(p)
    for flag, inp in fix_inputs().items():
        p.add_argument(flag, dest=inp.name, type=inp.type, metavar=inp.metavar,
                       help=inp.help)
    add_verify_args(p, "run the result through ncnn against a torch reference (needs --bin; "
                       "X.ref.npz next to the input or --reference)", tol=1e-4)
    p.add_argument("--reference", metavar="NPZ",
                   help="the torch reference (.npz; default: X.ref.npz next to the input): "
                        "what --verify compares with, and the length a static export is "
                        "dynamized to when its inputs are the traced ones at another length")
    p.add_argument("--always-write", action="store_true",
                   help="write the output even when nothing changed (a copy of the input) or "
                        "errors are left that no repair handles (then exit 1); without it "
                        "nothing is written in both cases")
    run.finish(p, explain="also list what each pass left alone")


def fix_inputs() -> dict[str, FixInput]:
    """The extra inputs the repairs declare (`Pass.fix_inputs`), one flag each."""
    out: dict[str, FixInput] = {}
    for cls in repairs():
        for inp in cls.fix_inputs:
            out.setdefault(inp.flag, inp)
    return out


# --------------------------------------------------------------------------- fix

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
    # pnnx's IR, read once for every lint round (lint only reads it)
    pnnx_ir = read_pnnx_param(ctx.traced) if ctx.traced is not None else None
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
    ctx = RepairContext(traced, weights=bin is not None, param=param, bin=bin)
    for cls in applied:
        pass_ = cls.for_fix(ctx, True)
        if pass_ is None:
            continue
        try:
            other = pass_(other).graph
        except ParamSurgeryError as exc:
            raise PassRefused(f"{param}: {cls.name} does not repair it like the input: "
                              f"{exc.message}") from None
    return other


class _FixAll:
    """`fix_graph` in the runner's shape: graph in, one PassResult out (the report in
    `data["report"]`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.traced = traced_path(args)

    def __call__(self, g: Graph) -> PassResult:
        from paramsurgery.formats.pnnx_reference import find_reference

        args = self.args
        options = {inp.name: getattr(args, inp.name, None) for inp in fix_inputs().values()}
        for inp in fix_inputs().values():  # a missing file is an input error, before any work
            value = options[inp.name]
            if inp.path and value is not None and not os.path.isfile(value):
                raise ParamSurgeryError(f"{inp.flag}: no such file", file=value)
        rep = fix_graph(g, traced=self.traced, param=args.param, bin=args.bin,
                        reference=args.reference or find_reference(args.param),
                        options=options)
        return PassResult(rep.graph, rep.modified,
                          [c for r in rep.results for c in r.changes],
                          [s for r in rep.results for s in r.skipped], pass_name="fix",
                          data={"report": rep})


def _report(run: Run) -> FixReport:
    return run.result.data["report"]


def _summary(run: Run) -> list[str]:
    rep, explain = _report(run), run.args.explain
    lines = [f"{len(rep.before)} finding(s); repairs called for: "
             f"{', '.join(rep.wanted) or 'none'}"]
    lines += [r.format(explain) for r in rep.results]
    lines += [f"{name}: refused (rolled back): {msg}" for name, msg in rep.failures]
    lines += [f"not repaired ({f.fix_pass} left it; --explain says why): "
              f"{f.format(run.args.param)}" for f in rep.fixable_left]
    lines += [f"not repairable here: {f.format(run.args.param)}" for f in rep.unrepairable]
    return lines


def _json(run: Run) -> dict:
    rep = _report(run)
    return {"findings_before": [f.to_json() for f in rep.before],
            "passes": [{"pass": r.pass_name, "modified": r.modified,
                        "changes": [c.__dict__ for c in r.changes]} for r in rep.results],
            "refused": [{"pass": n, "reason": m} for n, m in rep.failures],
            "findings_after": [f.to_json() for f in rep.after],
            "weights": run.bin_note,
            "verify": None if run.check is None else run.check.to_json()}


def _verify(run: Run, staged: Outputs) -> Check | None:
    """The repaired graph against the torch reference (a raw export may not load at all,
    so the reference is torch's numbers, not the input graph)."""
    from paramsurgery.formats.pnnx_reference import find_reference
    from paramsurgery.verify.reference import verify_against_reference

    args = run.args
    # a static export dynamized to the reference's length computes something new at that
    # length: proven against the reference whether --verify was given or not
    dynamized = any("length_spec" in r.data for r in _report(run).results)
    if not (args.verify or dynamized):
        return None
    ref = args.reference or find_reference(args.param)
    if ref is None:
        raise ParamSurgeryError("--verify needs a torch reference: X.ref.npz next to the input "
                                "or --reference REF.npz", file=args.param)
    if dynamized:
        if staged.bin is None:
            from paramsurgery.core.fs import companion

            staged.bin = companion(args.param, (".param", ".bin"), (".param.bin", ".bin"))
        if staged.bin is None:
            raise ParamSurgeryError(f"dynamized to the length of {ref}, which only a run "
                                    f"through ncnn proves: give the weights (--bin)",
                                    file=args.param)
        return _verify_other_length(run, staged, os.fspath(ref))
    return verify_against_reference(staged.param, staged.bin, os.fspath(ref), graph=run.graph,
                                    pnnx=args.pnnx or None, source=args.param, tol=args.tol)


def _verify_other_length(run: Run, staged: Outputs, ref: str) -> Check:
    """A static export dynamized to the reference's length: pnnx's traced shapes no longer
    pair the arrays with the blobs, so they are paired in order (and the batch axes read
    from the repaired graph) in a blob-keyed copy."""
    import tempfile

    from paramsurgery.core.npz import write_npz
    from paramsurgery.passes.dynamize_shapes import blob_keyed_reference
    from paramsurgery.verify.reference import verify_against_reference

    with tempfile.TemporaryDirectory(prefix="paramsurgery-fix-ref-") as tmp:
        keyed = os.path.join(tmp, "ref.npz")
        write_npz(keyed, blob_keyed_reference(ref, run.graph))
        check = verify_against_reference(staged.param, staged.bin, keyed, graph=run.graph,
                                         tol=run.args.tol)
    check.reference = ref
    return check


def _refuse(run: Run) -> tuple[int, str] | None:
    """A repair refused, or errors are left that no repair handles: nothing is written
    (exit 2), unless `--always-write` asks for the partly repaired graph (exit 1)."""
    rep = _report(run)
    if rep.failures:
        names = ", ".join(dict.fromkeys(name for name, _ in rep.failures))
        return 2, f"{len(rep.failures)} repair(s) refused ({names}; rolled back, see above)"
    left = rep.errors_left
    if left and not run.args.always_write:
        where = "; ".join(f"{f.code} {f.layer or 'header'}" +
                          (f" (line {f.line})" if f.line else "") for f in left[:5])
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        return 2, (f"{len(left)} error(s) no repair handles: {where}{more} (--always-write "
                   f"writes the partly repaired graph)")
    return None


def _skip_write(run: Run) -> str | None:
    if run.result.modified or run.args.always_write:
        return None
    return "nothing to change; no file written (--always-write writes a copy)"


def _exit_code(run: Run) -> int:
    rep = _report(run)
    return 1 if rep.errors_left else rep.exit_code


def _diagnostics(run: Run) -> list[str]:
    """Refusals, then every error left, located (`file:line: CODE ...`), for stderr."""
    rep = _report(run)
    return rep.located + [f"{f.format(run.args.param)}" for f in rep.errors_left]


run = GraphCommand("fixed", _FixAll, bin_note=True, verify=_verify,
                   refusal="the repaired graph does not match the reference", summary=_summary,
                   json=_json, exit_code=_exit_code, diagnostics=_diagnostics,
                   refuse=_refuse, skip_write=_skip_write)
