"""`paramsurgery demo`: run the main job on the bundled default graph."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run info, validate and a verified round trip on the "
                       "bundled graph (or on PARAM)")
    p.add_argument("param", nargs="?", help="use this .param instead of the bundled one")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.demo import run_demo

    return run_demo(args.param)
