"""`paramsurgery validate`: structural invariants ncnn relies on."""

from __future__ import annotations

import argparse

from paramsurgery.core.findings import ERROR
from paramsurgery.formats.io import load
from paramsurgery.commands._common import add_format_arg, print_json
from paramsurgery.analysis.validate import validate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check graph invariants (order, single producer, "
                       "dangling bottoms, Split discipline, header counts)")
    p.add_argument("param", nargs="+", help=".param file(s)")
    add_format_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    status = 0
    report = []
    for path in args.param:
        g = load(path)
        findings = validate(g)
        if any(f.severity == ERROR for f in findings):
            status = 1
        if args.format == "json":
            report.append({"file": path, "findings": [f.to_json() for f in findings]})
        else:
            for f in findings:
                print(f.format(path))
            if not findings:
                print(f"{path}: ok ({len(g)} layers, {g.blob_count()} blobs)")
    if args.format == "json":
        print_json(report)
    return status
