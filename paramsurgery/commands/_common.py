"""Helpers shared by the CLI subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import ParamSurgeryError


def add_format_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="output format (default: text)")


def add_output_args(parser: argparse.ArgumentParser, what: str = "output .param") -> None:
    parser.add_argument("-o", "--output", metavar="PATH",
                        help=f"{what} (written atomically; '-' for stdout)")
    parser.add_argument("--in-place", action="store_true",
                        help="overwrite the input file (atomically)")


def output_path(args: argparse.Namespace, input_path: str, *, required: bool = True) -> str | None:
    """Where to write: -o, or the input with --in-place. Never the input by accident."""
    out = getattr(args, "output", None)
    if getattr(args, "in_place", False):
        if out and out != "-":
            raise ParamSurgeryError("give either -o or --in-place, not both")
        return input_path
    if out is None:
        if required:
            raise ParamSurgeryError("no output given: use -o PATH (or --in-place to overwrite "
                                    "the input)", file=input_path)
        return None
    if out != "-" and os.path.exists(out) and os.path.samefile(out, input_path):
        raise ParamSurgeryError("-o names the input file; use --in-place to overwrite it",
                                file=input_path)
    return out


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
