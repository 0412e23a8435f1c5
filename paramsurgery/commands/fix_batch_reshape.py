"""`paramsurgery fix-batch-reshape`: merge pnnx's lossy Reshape pair (a 1-D tensor reshaped
into a layout whose batch axis holds its elements) into one Reshape."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fix-batch-reshape", help="merge a Reshape pair that drops a 1-D "
                       "tensor's elements into ncnn's batch axis (0=1 1=1, then 12=k 13=233 "
                       "0n) into one Reshape")
    add_pass_args(p, "batchfix")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.fix_batch_reshape import FixBatchReshape

    return run_param_pass(args, "batchfix", FixBatchReshape)
