"""`paramsurgery synth-bin`: a random `.bin` of exactly the layout a `.param` needs."""

from __future__ import annotations

import argparse
import os
import sys

from paramsurgery.core.words import counted
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.core.fs import atomic_open
from paramsurgery.formats.io import load


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth-bin",
        help="write random weights of exactly the layout a .param needs",
        description="Write a .bin with small random weights (uniform ±sqrt(3/fan_in), biases "
                    "±0.1, norm scales ≈ 1) in exactly the layout the .param makes ncnn read, "
                    "so a param-only graph can be loaded and run. Deterministic in --seed.")
    from paramsurgery.commands._common import add_format_arg, add_input_arg

    add_input_arg(p, ".param or .param.bin file")
    p.add_argument("-o", "--output", "--bin", dest="output", metavar="BIN",
                   help="output .bin (written atomically; default: <input>.bin beside the "
                        "input, as ncnn pairs them; '-' for stdout)")
    p.add_argument("--force", action="store_true",
                   help="replace BIN if it exists (it may hold real weights)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="storage of tagged weights (default fp32 = tag 0; untagged weights "
                        "are always raw fp32)")
    p.add_argument("--keep-values", metavar="NPZ",
                   help="arrays by layer name to write as given instead of random (one-weight "
                        "MemoryData layers: e.g. the constants pnnx folded from its trace, "
                        "kept from the export whose weights were not)")
    add_format_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.commands._common import print_json
    from paramsurgery.commands._runner import bin_path_for
    from paramsurgery.core import progress

    out = args.output or bin_path_for(args.param)
    progress.redirect(sys.stderr)  # the weights may go to stdout
    progress.plan(f"synth-bin: {args.param} -> {out}: {args.dtype} weights, seed {args.seed}",
                  aside=True)  # at once, before the graph is read (and numpy imported)
    from paramsurgery.formats.weights.synth import write_synth_bin

    g = load(args.param)
    if out != "-" and os.path.exists(out) and os.path.samefile(out, args.param):
        raise ParamSurgeryError("-o names the input .param", file=args.param)
    if out != "-" and os.path.lexists(out) and not args.force:
        raise ParamSurgeryError("exists; random weights would replace it (pass --force to "
                                "overwrite)", file=out)
    given = _read_values(args.keep_values) if args.keep_values else None
    if out == "-":
        n = write_synth_bin(g, sys.stdout.buffer, seed=args.seed, dtype=args.dtype,
                            given=given)
    else:
        with atomic_open(out) as fh:
            n = write_synth_bin(g, fh, seed=args.seed, dtype=args.dtype, given=given)
    if args.format == "json":
        print_json({"output": out, "bytes": n, "dtype": args.dtype, "layers": len(g),
                    "seed": args.seed, "files": [{"file": args.param, "role": "input"},
                                                 {"file": out, "role": "weights"}]},
                   stream=sys.stderr if out == "-" else sys.stdout)
    else:
        print(f"{out}: {n} bytes of {args.dtype} weights for {counted(len(g), 'layer')}",
              file=sys.stderr)
    return 0


def _read_values(path: str) -> dict:
    import zipfile

    import numpy as np

    from paramsurgery.core.errors import cannot_open

    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except OSError as exc:
        raise ParamSurgeryError(cannot_open(exc), file=path) from None
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ParamSurgeryError(f"not an .npz of arrays: {exc}", file=path) from None
