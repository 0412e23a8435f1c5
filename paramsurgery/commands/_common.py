"""Helpers shared by the CLI subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from paramsurgery.core.errors import ParamSurgeryError


def add_format_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="output format (default: text)")


def add_output_args(parser: argparse.ArgumentParser, what: str = "output .param") -> None:
    parser.add_argument("-o", "--output", metavar="PATH",
                        help=f"{what} (written atomically; '-' for stdout)")
    parser.add_argument("--in-place", action="store_true",
                        help="overwrite the input file (atomically)")
    add_report_arg(parser)


def add_report_arg(parser: argparse.ArgumentParser) -> None:
    """`--report PAGE` (the before/after page): every graph-writing command takes it."""
    from paramsurgery.view.report import add_report_arg as add

    add(parser)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; with `--report`, through the before/after page."""
    if getattr(args, "report", None):
        from paramsurgery.view.report import run_with_report

        return run_with_report(args, args.run)
    return args.run(args)


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


def derived_output(input_path: str, tag: str) -> str:
    """`model.param` → `model.<tag>.param` (next to the input)."""
    if input_path.endswith(".param"):
        return input_path[: -len(".param")] + f".{tag}.param"
    return input_path + f".{tag}.param"


def link_or_copy(src: str, dst: str) -> str:
    """Put `src`'s bytes at `dst` (hard link when possible, else an atomic copy); says which."""
    import shutil
    import tempfile

    if os.path.exists(dst) and os.path.samefile(src, dst):
        return "same file"
    directory = os.path.dirname(os.path.abspath(dst))
    fd, tmp = tempfile.mkstemp(prefix=".link.", dir=directory)
    os.close(fd)
    os.unlink(tmp)
    try:
        os.link(src, tmp)
        how = "hard link"
    except OSError:
        shutil.copyfile(src, tmp)
        how = "copy"
    os.replace(tmp, dst)
    return how


def add_pass_args(parser: argparse.ArgumentParser, tag: str) -> None:
    """Arguments every param-rewriting pass command takes."""
    parser.add_argument("param", help="input .param")
    add_output_args(parser, f"output .param (default: <input>.{tag}.param)")
    parser.add_argument("--explain", action="store_true",
                        help="also say why candidate layers were left alone")
    add_format_arg(parser)


def run_pass_located(pass_obj: Any, g: Any, path: str) -> Any:
    """Run a pass; a refusal that names no file names `path` (not `<input>`)."""
    from paramsurgery.core.errors import PassRefused

    try:
        return pass_obj(g)
    except PassRefused as exc:
        if exc.file is None:
            exc.file = path
        raise


def add_inputshape_args(parser: argparse.ArgumentParser, *, inputs: bool = True) -> None:
    """`--inputshape` (shapes of input blobs, symbolic dims allowed) and, for commands that
    run the graph, `--inputs inputs.npz` (arrays keyed by input blob name)."""
    from paramsurgery.analysis.shapes.spec import add_inputshape_arg

    add_inputshape_arg(parser)
    if inputs:
        parser.add_argument("--inputs", metavar="NPZ",
                            help="input arrays for runs (keys = input blob names); replaces "
                                 "the generated ones")


def inputshape_of(args: argparse.Namespace, g: Any = None) -> dict:
    """The parsed `--inputshape` (checked against `g`'s blobs when given)."""
    from paramsurgery.analysis.shapes.spec import check_blobs, inputshape_from_args

    shapes = inputshape_from_args(args)
    if g is not None:
        check_blobs(g, shapes, getattr(args, "param", None))
    return shapes


def command(sub: argparse._SubParsersAction, doc: str | None, run: Any = None,
            **options: Any) -> argparse.ArgumentParser:
    """A command's parser, declared by its docstring (the module's, or the run function's
    for a subcommand): the first paragraph is "`paramsurgery [GROUP] NAME`: one-line help",
    the paragraphs after it the description (what `NAME --help` prints; the help when
    there are none). `run` is what the command runs (GraphCommand sets it in `finish`)."""
    import inspect

    first, _, rest = inspect.cleandoc(doc or "").partition("\n\n")
    head, sep, help_text = " ".join(first.split()).partition(": ")
    words = head.strip("`").split()  # `paramsurgery [GROUP] NAME`
    name = words[-1] if len(words) >= 2 and words[0] == "paramsurgery" else ""
    if not sep or not name:
        raise ValueError(f"a command docstring starts with '`paramsurgery NAME`: help': {first!r}")
    p = sub.add_parser(name, help=help_text, description=" ".join(rest.split()) or help_text,
                       **options)
    if run is not None:
        p.set_defaults(run=run)
    return p


def add_input_arg(p: argparse.ArgumentParser, what: str = "input .param",
                  name: str = "param") -> None:
    """The graph a command reads (positional `param`)."""
    p.add_argument(name, help=what)


def write_graph(g: Any, out: str, note: str) -> None:
    """Write `g`'s text to `out` (atomically; '-' = stdout); then `note` (a format string
    of `out`) on stderr says what was written."""
    from paramsurgery.formats.io import param_bytes, save

    if out == "-":
        sys.stdout.buffer.write(param_bytes(g, out))
    else:
        save(g, out)  # a .param.bin output stays binary, its names in x.id.h beside it
        print(note.format(out=out), file=sys.stderr)
