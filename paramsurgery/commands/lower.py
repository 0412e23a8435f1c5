"""`paramsurgery lower`: pnnx leftovers with an exact ncnn equivalent → ncnn layers."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import add_partial_arg, add_pnnx_arg, traced_path
from paramsurgery.commands._runner import run_param_pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lower", help="rewrite pnnx leftovers that have an exact ncnn "
                       "equivalent (aten::addcmul, aten::lerp, aten::frac, F.softsign, "
                       "torch.narrow, ...) into ncnn layers; --list-rules shows them")
    add_pass_args(p, "lowered")
    add_pnnx_arg(p, "constants, arguments, traced shapes")
    p.add_argument("--rules", metavar="NAME,...", help="only these rules (see --list-rules)")
    p.add_argument("--skip-rules", metavar="NAME,...", help="leave these rules out")
    add_partial_arg(p)
    p.add_argument("--list-rules", action="store_true", help="print the rules and exit")
    p.add_argument("--traced-len", type=int, metavar="T",
                   help="the length pnnx traced at first (when its X_ncnn.py is not next to "
                        "the file): a constant pnnx folded equal to it is read as that length")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.lower import RULES, Lower

    rules = RULES
    if args.rules:
        rules = rules.only(n.strip() for n in args.rules.split(",") if n.strip())
    if args.skip_rules:
        rules = rules.without(n.strip() for n in args.skip_rules.split(","))
    if args.list_rules:
        for r in rules:
            print(f"{r.name:12} {', '.join(r.types):40} {r.doc}")
        return 0
    from paramsurgery.formats.pnnx_param import pnnx_graph

    traced = traced_path(args)
    # pnnx's IR parsed here, after the input (the pass receives the graph, reads no file)
    return run_param_pass(args, "lowered", lambda: Lower(rules, traced=pnnx_graph(traced),
                                                         partial=args.partial,
                                                         traced_len=args.traced_len))
