"""`paramsurgery lint`: find converter bugs and structural problems before ncnn does

Lint ncnn graphs written by pnnx: layers ncnn cannot load, parameterless Slices, batch-axis
leftovers, reductions that reduce nothing, float math on int ids, structure (PS1xx), weights
(PS2xx, --bin), scale hazards (PS3xx) and traced-shape conformance against pnnx's .pnnx.param
and a torch reference (PS4xx). pnnx's files next to FILE (X.pnnx.param, X_ncnn.py,
X.ref.npz / ref.npz, X.ncnn.bin) are used when present.

Text output is one line per finding, like ruff (`file:line: CODE severity message (fix:
…)`), then a summary line; `--format json` prints a summary and the entries (the shape of
Polygraphy's lint report). Exit 1 when an error-level finding exists, 2 when an input
cannot be read, else 0.
"""

from __future__ import annotations

import argparse
import sys

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.core.findings import ERROR, INFO, WARNING, Finding
from paramsurgery.commands._common import add_format_arg, command, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run_cmd,
                epilog="Codes: PS0xx converter/layer, PS1xx structure, PS2xx weights, PS3xx "
                       "scale, PS4xx shapes. 'paramsurgery lint --list' lists the rules, "
                       "'--explain CODE' explains one.")
    p.add_argument("param", nargs="*", metavar="FILE", help=".param or .param.bin file(s)")
    p.add_argument("--bin", metavar="B", help="weights: check the .bin (PS2xx) and run with it")
    p.add_argument("--pnnx-param", metavar="X", help="pnnx's .pnnx.param (default: next to FILE)")
    p.add_argument("--reference", metavar="NPZ",
                   help="inputs and torch outputs (in0…/out0… or input_*/output_* arrays; "
                        "default: X.ref.npz or ref.npz next to FILE)")
    p.add_argument("--input-shape", metavar="SHAPES",
                   help="traced input shapes in pnnx syntax with optional batch axis, e.g. "
                        "'[1,4,10]f32@0,[7]i32@233' (default: pnnx's X_ncnn.py next to FILE)")
    from paramsurgery.commands._common import add_inputshape_args

    add_inputshape_args(p, inputs=False)
    run = p.add_mutually_exclusive_group()
    run.add_argument("--no-run", dest="run_ncnn", action="store_false", default=None,
                     help="static rules only: never run the graph through ncnn")
    run.add_argument("--run", dest="run_ncnn", action="store_true",
                     help="always try the conformance run")
    p.add_argument("--select", action="append", metavar="CODES",
                   help="only these codes or prefixes (comma-separated, repeatable: PS0,PS101)")
    p.add_argument("--ignore", action="append", metavar="CODES",
                   help="skip these codes or prefixes")
    p.add_argument("--no-discover", action="store_true",
                   help="do not look for pnnx's files next to FILE")
    p.add_argument("--explain", metavar="CODE", help="print what a rule checks and exit")
    p.add_argument("--list", action="store_true", help="list every rule and exit")
    add_format_arg(p)


def run_cmd(args: argparse.Namespace) -> int:
    from paramsurgery.lint import all_rules, get_rule

    if args.explain:
        r = get_rule(args.explain)
        if r is None:
            raise ParamSurgeryError(f"no lint rule {args.explain!r} (see paramsurgery lint "
                                    f"--list)")
        if args.format == "json":
            print_json({**r.to_json(), "doc": r.doc})
        else:
            print(r.explain())
        return 0
    if args.list:
        rules = all_rules()
        if args.format == "json":
            print_json([r.to_json() for r in rules.values()])
        else:
            for r in rules.values():
                fix = f"  [{r.fix}]" if r.fix else ""
                off = "  (off by default)" if not r.default else ""
                sev = "/".join(r.severities)
                print(f"{r.code}  {sev:<13}  {r.name:<26} {r.summary}{fix}{off}")
        return 0
    if not args.param:
        raise ParamSurgeryError("no input: give one or more .param files (or --explain CODE, "
                                "--list)")
    if len(args.param) > 1 and (args.bin or args.pnnx_param or args.reference or
                                args.input_shape):
        raise ParamSurgeryError("--bin, --pnnx-param, --reference and --input-shape apply to one "
                                "file; lint several files without them")
    return lint_paths(args)


def lint_paths(args: argparse.Namespace) -> int:
    from paramsurgery.lint import lint_file, summarize
    from paramsurgery.analysis.shapes.spec import inputshape_from_args
    from paramsurgery.lint.catalogue import select_rules

    try:
        select_rules(args.select, args.ignore)
    except ValueError as exc:
        raise ParamSurgeryError(str(exc)) from None
    if args.run_ncnn is not False:  # PS112 will ask ncnn: its child starts while we parse
        from paramsurgery.runtime.loader import prestart

        prestart()
    results: list[tuple[str, list[Finding] | None, str | None]] = []
    unreadable = 0
    for path in args.param:
        try:
            findings = lint_file(path, bin=args.bin, pnnx_param=args.pnnx_param,
                                 select=args.select, ignore=args.ignore,
                                 reference=args.reference, input_shapes=args.input_shape,
                                 run=args.run_ncnn, discover=not args.no_discover,
                                 inputshape=inputshape_from_args(args))
        except ParamSurgeryError as exc:
            print(str(exc), file=sys.stderr)
            unreadable += 1
            results.append((path, None, str(exc)))
            continue
        except ValueError as exc:  # a malformed --input-shape
            raise ParamSurgeryError(str(exc)) from None
        results.append((path, findings, None))
    all_findings = [f for _, fs, _ in results if fs for f in fs]
    counts = summarize(all_findings)
    if args.format == "json":
        print_json(_json_report(results, counts))
    else:
        for path, fs, _ in results:
            for f in fs or ():
                print(f.format(path))
        print(_summary_line(counts, len(args.param), unreadable))
    if unreadable:
        return 2
    return 1 if counts[ERROR] else 0


def _summary_line(counts: dict, files: int, unreadable: int) -> str:
    total = sum(counts.values())
    read = files - unreadable
    where = f"{read} file" + ("s" if read != 1 else "")
    tail = f" ({unreadable} could not be read)" if unreadable else ""
    if not total:
        return (f"All checks passed ({where})." if not unreadable
                else f"No findings in {where}{tail}.")
    parts = [f"{counts[s]} {name}" + ("s" if counts[s] != 1 else "")
             for s, name in ((ERROR, "error"), (WARNING, "warning"), (INFO, "info"))
             if counts[s]]
    return (f"Found {total} finding{'s' if total != 1 else ''} in {where}: "
            f"{', '.join(parts)}{tail}.")


def _json_report(results: list, counts: dict) -> dict:
    from paramsurgery.lint import fix_pass_of

    entries = []
    passing: list[str] = []
    failing: list[str] = []
    unreadable: list[dict[str, str | None]] = []
    for path, fs, err in results:
        if fs is None:
            unreadable.append({"file": path, "error": err})
            continue
        (failing if any(f.severity == ERROR for f in fs) else passing).append(path)
        for f in fs:
            entries.append({"file": f.file or path, "code": f.code, "severity": f.severity,
                            "layer": f.layer, "line": f.line, "message": f.message,
                            "fix": f.fix, "fix_pass": fix_pass_of(f)})
    return {"summary": {"files": len(results), "passing": passing, "failing": failing,
                        "unreadable": unreadable, "errors": counts[ERROR],
                        "warnings": counts[WARNING], "infos": counts[INFO]},
            "lint_entries": entries}
