"""`paramsurgery insert`: a 1 -> 1 layer on an edge."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass
from paramsurgery.commands.set_param import intermixed, take_assignments


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("insert", help="insert a 1 -> 1 layer (Reshape, ReLU, ...) before a "
                       "layer's bottom or after its top, checked by ncnn's load_param")
    add_pass_args(p, "inserted")
    p.add_argument("assignments", nargs="*", metavar="ID=VALUE", help="params of the new layer")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--before", nargs="+", metavar="LAYER[:SLOT]",
                       help="on bottom SLOT (default 0) of these layers")
    where.add_argument("--after", nargs="+", metavar="LAYER[:SLOT]",
                       help="on top SLOT (default 0) of these layers")
    p.add_argument("--type", required=True, dest="layer_type", metavar="TYPE",
                   help="an ncnn layer type without weights")
    p.add_argument("--name", required=True, metavar="NAME",
                   help="the new layer's name; {layer} and {slot} are replaced per target")
    p.add_argument("--force", action="store_true", help="allow param ids the type does not read")
    p.set_defaults(run=run)
    intermixed(p)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.insert import InsertLayer

    take_assignments(args, "before", "after")
    return run_param_pass(args, "inserted", lambda: InsertLayer(args.layer_type, args.name,
                                                                before=args.before or (),
                                                                after=args.after or (),
                                                                assignments=args.assignments,
                                                                force=args.force))
