"""`paramsurgery fix FILE`: lint, run every repair pass the findings call for, write.

The passes run in a `PassManager` (fix-slice, then fix-reduction, then dynamize when a
length is given); a pass that refuses is rolled back and its reason printed, the others
still apply. Afterwards the graph is linted again: what is left is either nothing, or
findings no pass repairs (listed, exit 1), or refusals (exit 2).

Findings come from `paramsurgery.lint.lint_graph` when it is available; otherwise from the
repair passes' own detectors (the same patterns: parameterless / batch-axis Slices, raw
unbinds, Reductions with empty axes, and non-ncnn layer types, which no pass repairs).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from ..findings import ERROR, WARNING, Finding
from ..graph import Graph
from ._common import add_format_arg, add_output_args, derived_output, output_path, print_json

REPAIRS = ("fix-slice", "fix-reduction", "dynamize")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fix", help="lint, then run every repair pass the findings call for "
                       "(fix-slice, fix-reduction, dynamize)")
    p.add_argument("param", help="input .param")
    add_output_args(p, "output .param (default: <input>.fixed.param)")
    p.add_argument("--pnnx", metavar="PNNX_PARAM",
                   help="pnnx's IR with traced shapes (default: X.pnnx.param next to "
                        "X.ncnn.param, if present)")
    p.add_argument("--traced-len", type=int, metavar="T",
                   help="also dynamize a static export traced at T")
    p.add_argument("--pair", metavar="OTHER_PARAM",
                   help="also dynamize against the same model exported at another length")
    p.add_argument("--explain", action="store_true", help="also list what each pass left alone")
    add_format_arg(p)
    p.set_defaults(run=run)


# --------------------------------------------------------------------------- detection

def detect(g: Graph) -> list[Finding]:
    """The patterns the repair passes know, as findings (used until/unless lint is present)."""
    from ..layer_types import is_converter_leftover, is_ncnn_layer
    from ..passes.fix_reduction import batch_concat, has_empty_axes
    from ..passes.fix_slice import needs_fix

    out: list[Finding] = []
    for layer in g:
        why = needs_fix(layer)
        if why:
            out.append(Finding("slice", ERROR, why, layer.name, layer.source_line,
                               fix="paramsurgery fix-slice"))
            continue
        if has_empty_axes(layer):
            msg = ("Reduction of a Concat 0=-233 stack (empty axes)" if batch_concat(g, layer)
                   else "Reduction with empty axes and 1=0 reduces nothing")
            out.append(Finding("reduction-empty-axes", ERROR, msg, layer.name,
                               layer.source_line, fix="paramsurgery fix-reduction"))
            continue
        if not is_ncnn_layer(layer.type):
            kind = "a pnnx/torch leftover" if is_converter_leftover(layer.type) else "unknown"
            out.append(Finding("not-ncnn-layer", ERROR, f"layer type {layer.type} is {kind}; "
                               f"ncnn cannot load it", layer.name, layer.source_line))
    return out


def lint_findings(g: Graph, traced=None) -> list[Finding]:  # noqa: ANN001
    try:
        from ..lint import lint_graph  # type: ignore[attr-defined]
    except ImportError:
        return detect(g)
    try:
        found = list(lint_graph(g))
    except Exception:  # noqa: BLE001 - a lint in progress must not break repairs
        return detect(g)
    # the passes' own detectors as a safety net for patterns a lint rule may not cover yet
    seen = {(f.layer, _repair_of(f)) for f in found}
    found += [f for f in detect(g) if f.fix and (f.layer, _repair_of(f)) not in seen]
    return found


def _repair_of(f: Finding) -> str | None:
    for name in REPAIRS:
        if f.fix and name in f.fix.split():
            return name
        if f.fix and f.fix.endswith(name):
            return name
    return None


# --------------------------------------------------------------------------- fix

@dataclass
class FixReport:
    graph: Graph
    before: list[Finding]
    after: list[Finding]
    results: list = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    wanted: list[str] = field(default_factory=list)

    @property
    def fixable_left(self) -> list[Finding]:
        return [f for f in self.after if _repair_of(f)]

    @property
    def unrepairable(self) -> list[Finding]:
        return [f for f in self.after if not _repair_of(f) and f.severity in (ERROR, WARNING)]

    @property
    def exit_code(self) -> int:
        if self.failures:
            return 2
        return 1 if any(f.severity == ERROR for f in self.unrepairable) else 0


def fix_graph(g: Graph, *, traced=None, traced_len: int | None = None,  # noqa: ANN001
              pair=None) -> FixReport:  # noqa: ANN001
    from ..passes.base import PassManager
    from ..passes.dynamize import Dynamize
    from ..passes.fix_reduction import FixReduction
    from ..passes.fix_slice import FixSlice
    from ..passes import _traced

    traced_ops = _traced.load_traced(traced)
    before = lint_findings(g)
    wanted = {r for f in before if (r := _repair_of(f))}
    if traced_len is not None or pair is not None:
        wanted.add("dynamize")
    passes = []
    if "fix-slice" in wanted:
        passes.append(FixSlice(traced=traced_ops))
    if "fix-reduction" in wanted:
        passes.append(FixReduction(traced=traced_ops))
    if "dynamize" in wanted and (traced_len is not None or pair is not None):
        passes.append(Dynamize(traced_len, pair=pair, traced=traced_ops))
    current, results, failures = PassManager(passes, early_stop=False).run(g)
    if "dynamize" in wanted and traced_len is None and pair is None:
        failures.append(("dynamize", "a finding calls for dynamize, which needs --traced-len T "
                                     "or --pair OTHER.param"))
    after = lint_findings(current)
    return FixReport(current, before, after, results, failures,
                     [p.name for p in passes])


def run(args: argparse.Namespace) -> int:
    from ..io import atomic_write, load
    from ..passes._traced import companion_pnnx

    if args.output is None and not args.in_place:
        args.output = derived_output(args.param, "fixed")
    out = output_path(args, args.param)
    g = load(args.param)
    traced = args.pnnx or companion_pnnx(args.param)
    rep = fix_graph(g, traced=traced, traced_len=args.traced_len, pair=args.pair)
    modified = any(r.modified for r in rep.results)
    data = rep.graph.dump_bytes()
    if out == "-":
        sys.stdout.buffer.write(data)
    elif modified or out != args.param:
        atomic_write(out, data)
    if args.format == "json":
        print_json({"output": out, "modified": modified,
                    "findings_before": [f.to_json() for f in rep.before],
                    "passes": [{"pass": r.pass_name, "modified": r.modified,
                                "changes": [c.__dict__ for c in r.changes]} for r in rep.results],
                    "refused": [{"pass": n, "reason": m} for n, m in rep.failures],
                    "findings_after": [f.to_json() for f in rep.after]})
        return rep.exit_code
    stream = sys.stderr if out == "-" else sys.stdout
    print(f"{len(rep.before)} finding(s); repairs called for: "
          f"{', '.join(rep.wanted) or 'none'}", file=stream)
    for r in rep.results:
        print(r.format(args.explain), file=stream)
    for name, msg in rep.failures:
        print(f"{name}: refused (rolled back): {msg}", file=stream)
    for f in rep.unrepairable:
        print(f"not repairable here: {f.format(args.param)}", file=stream)
    if out != "-":
        print(f"wrote {out}" if (modified or out != args.param) else f"{out} unchanged",
              file=stream)
    return rep.exit_code
