"""`paramsurgery lower`: pnnx leftovers with an exact ncnn equivalent → ncnn layers."""

from __future__ import annotations

import argparse

from ._common import add_pass_args
from ._withbin import run_with_bin
from .set_param import run_located


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lower", help="rewrite pnnx leftovers that have an exact ncnn "
                       "equivalent (aten::addcmul, aten::lerp, aten::frac, F.softsign, "
                       "torch.narrow, ...) into ncnn layers; --list-rules shows them")
    add_pass_args(p, "lowered")
    p.add_argument("--pnnx", metavar="PNNX_PARAM",
                   help="pnnx's IR (constants, arguments, traced shapes); default: "
                        "X.pnnx.param next to X.ncnn.param, if present")
    p.add_argument("--rules", metavar="NAME,...", help="only these rules (see --list-rules)")
    p.add_argument("--skip-rules", metavar="NAME,...", help="leave these rules out")
    p.add_argument("--partial", action="store_true",
                   help="lower what can be and keep (and list) the rest instead of refusing")
    p.add_argument("--list-rules", action="store_true", help="print the rules and exit")
    p.add_argument("--bin", metavar="BIN",
                   help="the weights: needed by rules that add constants (arange's position "
                        "table); the output's weights are written next to it (<output>.bin)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..passes._traced import companion_pnnx
    from ..passes.lower import RULES, Lower

    rules = RULES
    if args.rules:
        rules = rules.only(n.strip() for n in args.rules.split(",") if n.strip())
    if args.skip_rules:
        rules = rules.without(n.strip() for n in args.skip_rules.split(","))
    if args.list_rules:
        for r in rules:
            print(f"{r.name:12} {', '.join(r.types):40} {r.doc}")
        return 0
    traced = args.pnnx or companion_pnnx(args.param)
    if args.bin:
        return run_with_bin(args, Lower(rules, traced=traced, partial=args.partial),
                            "lowered")
    return run_located(args, lambda: Lower(rules, traced=traced, partial=args.partial),
                       "lowered")
