"""`paramsurgery fix-slice`: parameterless / batch-axis Slices and raw torch.unbind → valid Slice."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass
from paramsurgery.commands._runner import add_partial_arg, add_pnnx_arg, traced_path
from paramsurgery.formats.pnnx_traced import load_traced


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fix-slice", help="repair Slices ncnn cannot run (no slices/indices, "
                       "raw torch.unbind, 1=-233 batch-axis slices)")
    add_pass_args(p, "fixslice")
    add_pnnx_arg(p)
    add_partial_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.fix_slice import FixSlice

    return run_param_pass(args, "fixslice", lambda: FixSlice(traced=load_traced(traced_path(args)),
                                                             partial=args.partial))
