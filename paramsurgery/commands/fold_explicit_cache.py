"""`paramsurgery fold-explicit-cache`: Concat(past, current) caches → SDPA native cache."""

from __future__ import annotations

import argparse

from ._common import add_pass_args, run_param_pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fold-explicit-cache", help="fold an explicit Concat(past, current) k/v "
                       "cache into SDPA's native kv cache (7=1)")
    add_pass_args(p, "nativecache")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..passes.fold_explicit_cache import FoldExplicitCache

    return run_param_pass(args, FoldExplicitCache(), "nativecache")
