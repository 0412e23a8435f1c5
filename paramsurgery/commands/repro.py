"""`paramsurgery repro`: minimal pnnx->ncnn bug repros: list, re-check, write an upstream issue

The catalogue of minimal pnnx 20261020 -> ncnn conversion bugs (fixtures/repros): list it,
check every case against the installed torch/pnnx/ncnn, or write an issue bundle for one
case (subcommands list, check, issue).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paramsurgery.commands._common import add_format_arg, command, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__)
    rsub = p.add_subparsers(dest="repro_command", metavar="SUBCOMMAND")

    lp = command(rsub, run_list.__doc__, run_list)
    add_format_arg(lp)

    cp = command(rsub, run_check.__doc__, run_check)
    cp.add_argument("ids", nargs="*", metavar="ID", help="case ids or numbers (default: all)")
    cp.add_argument("--keep", metavar="DIR", help="keep the exported files in DIR/<case>/<variant>/")
    cp.add_argument("--timeout", type=float, default=300.0,
                    help="seconds per pnnx run and per ncnn run (default 300)")
    add_format_arg(cp)

    ip = command(rsub, run_issue.__doc__, run_issue)
    ip.add_argument("id", metavar="ID", help="case id or number")
    ip.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    ip.add_argument("--fresh", action="store_true",
                    help="export and run now with the installed torch/pnnx/ncnn instead of "
                         "using the committed fixture")
    add_format_arg(ip)
    ip.add_argument("--no-lint", action="store_true",
                    help="leave out the `paramsurgery lint` findings")

    def no_subcommand(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(run=no_subcommand)


def run_list(args: argparse.Namespace) -> int:
    """`paramsurgery repro list`: the catalogue with the statuses recorded in the fixtures"""
    from paramsurgery.repro.catalogue import format_rows, rows

    table = rows()
    if args.format == "json":  # one object (README "JSON output")
        print_json({"cases": table, "files": [{"file": c["fixture"], "role": "fixture"}
                                              for c in table if c.get("fixture")]})
    else:
        print(format_rows(table))
    return 0


def run_check(args: argparse.Namespace) -> int:
    """`paramsurgery repro check`: export every case again with pnnx and run it in ncnn

    For each case and variant: trace the minimal model, export it with the pnnx binary (exit
    code checked), run the ncnn graph in a child process at a length no trace used, compare
    with torch. Verdict per case: still reproduces / fixed in this pnnx / different failure.
    Exit 1 when any status differs from the one recorded in the fixtures, 2 when torch or
    pnnx is missing.
    """
    from paramsurgery.repro.catalogue import resolve_ids
    from paramsurgery.repro.observe import check_cases, environment, format_table, to_json

    try:
        cases = resolve_ids(args.ids)
    except KeyError as exc:
        from paramsurgery.core.errors import ParamSurgeryError

        raise ParamSurgeryError(str(exc.args[0])) from None

    def progress(vc) -> None:
        mark = "" if not vc.changed else f"   (recorded {vc.baseline})"
        print(f"  {vc.case:<24} {vc.variant:<10} {vc.status:<11} {vc.seconds:5.1f}s{mark}",
              file=sys.stderr)

    env = environment()
    if args.format != "json":
        print(f"pnnx {env['pnnx']}, ncnn {env['ncnn']}, torch {env['torch']}, "
              f"python {env['python']}, {env['os']}", file=sys.stderr)
    results = check_cases(cases, keep=Path(args.keep) if args.keep else None,
                          timeout=args.timeout, progress=progress)
    if args.format == "json":
        print_json({"environment": env, "cases": to_json(results)})
    else:
        print(f"paramsurgery repro check: pnnx {env['pnnx']}, ncnn {env['ncnn']}, "
              f"torch {env['torch']}")
        print(format_table(results))
    return 1 if any(r.changed for r in results) else 0


def run_issue(args: argparse.Namespace) -> int:
    """`paramsurgery repro issue`: write ISSUE.md, test_<id>.py, the model script and
    exported files

    Write what a pnnx/ncnn maintainer needs for one case into DIR: ISSUE.md (title,
    environment, minimal model, pnnx command, expected vs observed, offending lines, why,
    workaround, related issues), test_<id>.py in the shape of pnnx's tests/ncnn tests,
    model.py and the files pnnx wrote. Uses the committed fixture unless --fresh.
    """
    from paramsurgery.core.errors import ParamSurgeryError
    from paramsurgery.repro.issue import write_issue

    try:
        written = write_issue(args.id, args.output, use_fresh=args.fresh, lint=not args.no_lint)
    except KeyError as exc:
        raise ParamSurgeryError(str(exc.args[0])) from None
    if args.format == "json":
        print_json({"case": args.id, "output": args.output,
                    "files": [{"file": str(path), "role": str(role)}
                              for role, path in written.items()]})
        return 0
    for path in written.values():
        print(path)
    return 0
