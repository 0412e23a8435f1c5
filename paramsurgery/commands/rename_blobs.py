"""`paramsurgery rename-blobs`: rename blobs everywhere they are written or read (OLD=NEW...),
or every kv-cache blob to a naming convention

Rename blobs everywhere they are written or read: OLD=NEW pairs applied at once, or
--cache-naming for every kv-cache blob. Writes <input>.renamed.param unless -o / --in-place.
"""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args, command
from paramsurgery.commands._runner import run_param_pass
from paramsurgery.commands.set_param import intermixed


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run)
    add_pass_args(p, "renamed")
    p.add_argument("renames", nargs="*", metavar="OLD=NEW", help="blob renames (applied at once)")
    p.add_argument("--cache-naming", choices=("ncnn-docs", "ncnn-llm"),
                   help="rename the cache blobs of every 7=1 attention layer: ncnn-docs "
                        "cache_k_in_{i}/cache_k_out_{i}, ncnn-llm cache_k{i}/out_cache_k{i}; "
                        "i = the layer's ordinal among all attention layers")
    intermixed(p)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.io_edits import RenameBlobs

    return run_param_pass(args, "renamed",
                          lambda: RenameBlobs(args.renames, cache_naming=args.cache_naming))
