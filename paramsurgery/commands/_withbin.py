"""Running a pass on a param *and its weights*: for passes that write weights (lower's
arange table, dynamize's position tables), `-o Y.param` writes `Y.bin` next to it."""

from __future__ import annotations

import argparse
import os

from ..errors import ParamSurgeryError


def run_with_bin(args: argparse.Namespace, pass_obj, tag: str) -> int:  # noqa: ANN001
    """Load `args.param` with `args.bin`, run the pass, write `<output>` and `<output>.bin`
    together (atomically); refusals are located at the input."""
    from ..io import load
    from ._common import derived_output, output_path

    if args.output is None and not args.in_place:
        args.output = derived_output(args.param, tag)
    out = output_path(args, args.param)
    if out == "-":
        raise ParamSurgeryError("--bin writes <output>.bin next to the output: give -o FILE")
    try:
        result = pass_obj(load(args.param, bin=args.bin))
    except ParamSurgeryError as exc:
        if exc.file is None:
            exc.file = args.param
        raise
    stem = out[:-len(".param")] if out.endswith(".param") else out
    bin_out = stem + ".bin"
    if os.path.abspath(bin_out) == os.path.abspath(args.bin) and not args.in_place:
        raise ParamSurgeryError(f"{bin_out} is the input weights; choose another -o")
    result.graph.save(out, bin_out)
    print(result.format(args.explain))
    print(f"wrote {out} and {bin_out}")
    return 0
