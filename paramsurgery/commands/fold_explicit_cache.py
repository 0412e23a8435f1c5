"""`paramsurgery fold-explicit-cache`: Concat(past, current) caches → SDPA native cache."""

from __future__ import annotations

import argparse
import os
import tempfile

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.analysis.shapes.spec import inputshape_from_args
from paramsurgery.commands._common import add_inputshape_arg
from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass
from paramsurgery.commands._runner import add_verify_args
from paramsurgery.formats.param_text import dump_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fold-explicit-cache", help="fold an explicit Concat(past, current) k/v "
                       "cache into SDPA's native kv cache (7=1)")
    add_pass_args(p, "nativecache")
    add_verify_args(p, "prove the rewrite through ncnn with a decode loop: prefill, then "
                       "steps feeding back ncnn's caches, against the input graph fed plain "
                       "past arrays (inputs from --feeds, else generated from --inputshape)",
                    tol=1e-5)
    p.add_argument("--feeds", metavar="NPZ",
                   help="--verify: the non-cache inputs of each call, arrays named "
                        "'<input>@<step>' (step 0 = prefill) in ncnn layout")
    add_inputshape_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.fold_explicit_cache import FoldExplicitCache

    verify = None
    if args.verify:
        shapes = inputshape_from_args(args)
        if args.feeds and shapes:
            raise ParamSurgeryError("give either --feeds or --inputshape, not both",
                                    file=args.param)
        steps = load_steps(args.feeds) if args.feeds else None
        verify = lambda result: _prove(args, result, steps, shapes)  # noqa: E731
    return run_param_pass(args, "nativecache", FoldExplicitCache, prove=verify)


def load_steps(path: str) -> list[dict]:
    """`<input>@<step>` arrays → one dict of feeds per step, in step order."""
    import numpy as np

    from paramsurgery.formats.pnnx_reference import REFERENCE_ERRORS

    try:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
    except REFERENCE_ERRORS as exc:
        raise ParamSurgeryError(f"cannot read the feeds: {exc or type(exc).__name__}",
                                file=path) from None
    steps: dict[int, dict] = {}
    for key, arr in arrays.items():
        name, at, step = key.rpartition("@")
        if not at or not step.isdigit():
            raise ParamSurgeryError(f"array {key!r} is not named '<input>@<step>'", file=path)
        steps.setdefault(int(step), {})[name] = arr
    if sorted(steps) != list(range(len(steps))) or len(steps) < 2:
        raise ParamSurgeryError("need steps 0 (prefill), 1, ... without gaps", file=path)
    return [steps[i] for i in range(len(steps))]


def _prove(args: argparse.Namespace, result, steps: list[dict] | None, shapes: dict):
    from paramsurgery.passes.fold_explicit_cache import FoldedCache
    from paramsurgery.verify.fold import decode_steps, verify_fold
    from paramsurgery.core.fs import atomic_write

    caches = [FoldedCache(**c) for c in result.data["caches"]]
    if steps is None:  # generated: the folded graph keeps every input's name and reader
        steps = decode_steps(result.graph, caches, shapes, args.param)
    cache_blobs = {x for c in caches for x in (c.present_k, c.present_v, c.concat_k, c.concat_v)}
    outputs = [b for b in result.graph.outputs if b not in cache_blobs]
    with tempfile.TemporaryDirectory(prefix="paramsurgery-fold-") as tmp:
        folded = os.path.join(tmp, "folded.param")
        atomic_write(folded, dump_bytes(result.graph))
        return verify_fold(args.param, folded, args.bin, caches, steps, outputs, tol=args.tol)
