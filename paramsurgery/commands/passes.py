"""`paramsurgery passes`: list the graph passes."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_format_arg, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("passes", help="list the available graph passes",
                       description="Every registered graph pass: its name, what it does and "
                       "the command that runs it.")
    add_format_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.base import all_passes

    passes = all_passes()
    if args.format == "json":
        print_json({"passes": [{"name": n, "summary": c.summary, "command": c.command}
                               for n, c in passes.items()]})
        return 0
    width = max(len(n) for n in passes) if passes else 0
    for name, cls in passes.items():
        print(f"{name:<{width}}  {cls.summary}" + (f"  [{cls.command}]" if cls.command else ""))
    return 0
