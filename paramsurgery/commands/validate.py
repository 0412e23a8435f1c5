"""`paramsurgery validate`: structural invariants ncnn relies on."""

from __future__ import annotations

import argparse

from paramsurgery.core.words import counted
from paramsurgery.core.findings import ERROR
from paramsurgery.formats.io import load
from paramsurgery.commands._common import add_format_arg, print_json
from paramsurgery.analysis.validate import validate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check graph invariants (order, single producer, "
                       "dangling bottoms, Split discipline, header counts)",
                       description="The structural invariants ncnn relies on (PS101-PS110 and "
                       "the run-time contracts): exit 1 on an error-level finding, 0 otherwise.")
    from paramsurgery.commands._common import add_input_arg, add_weights_arg

    add_input_arg(p, ".param file(s)", nargs="+")
    add_weights_arg(p, "weights (.bin, one file only): also checked against the graph "
                       "(a mismatch names the layer, exit 2)")
    add_format_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    status = 0
    report = []
    if args.bin and len(args.param) > 1:
        from paramsurgery.core.errors import ParamSurgeryError

        raise ParamSurgeryError("--bin goes with one file")
    for path in args.param:
        g = load(path, bin=args.bin)
        findings = validate(g)
        if any(f.severity == ERROR for f in findings):
            status = 1
        if args.format == "json":
            report.append({"file": path, "findings": [f.to_json() for f in findings]})
        else:
            for f in findings:
                print(f.format(path))
            if not findings:
                print(f"{path}: ok ({counted(len(g), 'layer')}, {counted(g.blob_count(), 'blob')})")
    if args.format == "json":
        print_json({"files": report})
    return status
