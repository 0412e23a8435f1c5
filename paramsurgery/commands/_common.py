"""Helpers shared by the CLI subcommands."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Sequence

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
    """`--report PAGE` (the before/after page, `view.report.run_with_report`): every
    graph-writing command takes it. Declared here, so registering a command imports no
    page code (the command's first line comes at once)."""
    parser.add_argument("--report", metavar="PAGE",
                        help="also write an HTML page with the graph before and after, the "
                             "changes coloured (see `paramsurgery diff`)")


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


# --------------------------------------------------------------------------- conventions
# One argument convention for every command (README "Conventions"): declared here once.

# `NAME=[d0,...]` (one spec, or several in one quoted word): what `--inputshape` takes
_SHAPE_ITEM_RE = re.compile(r"^[^-=\s][^=\s]*=[\[(]")
# `-23310=1,0.2`: a negative param id assignment, a positional (not an unknown option)
_NEGATIVE_ASSIGN_RE = re.compile(r"^-[0-9]+=")


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """`--inputshape a=[..] b=[..] FILE` → `--inputshape=a=[..] --inputshape=b=[..] FILE`:
    the flag takes its `NAME=[..]` items up to the next flag and never the file after them
    (one value per flag otherwise). Nothing after `--` is touched."""
    out: list[str] = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            out.extend(argv[i:])
            break
        if tok == "--inputshape" and i + 1 < len(argv):
            j = i + 1
            if not _SHAPE_ITEM_RE.match(argv[j]):  # one value of another form
                out += [tok, argv[j]]
                i = j + 1
                continue
            while j < len(argv) and _SHAPE_ITEM_RE.match(argv[j]):
                out.append(f"--inputshape={argv[j]}")
                j += 1
            i = j
            continue
        out.append(tok)
        i += 1
    return out


class CommandParser(argparse.ArgumentParser):
    """Every command's parser (`add_subparsers(parser_class=CommandParser)`): `-q/--quiet`
    on every command, `-23310=...` taken as a positional (an assignment of a negative param
    id, not an unknown option), `--inputshape` items never swallowing a positional
    (`normalize_argv`), and an unknown option answered with this command's usage and the
    closest options (`unknown_option_error`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("-q", "--quiet", action="store_true",
                          help="no progress lines or bar (the report is still printed)")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if args is not None:
            args = normalize_argv(args)
        return super().parse_known_args(args, namespace)

    def _parse_optional(self, arg_string: str) -> Any:
        if _NEGATIVE_ASSIGN_RE.match(arg_string):
            return None
        return super()._parse_optional(arg_string)

    def unknown_option_error(self, extras: Sequence[str]) -> None:
        """`unrecognized arguments: --verfy (did you mean --verify?)` with this command's
        usage, exit 2 (argparse's `error`)."""
        import difflib

        options = [o for a in self._actions for o in a.option_strings]
        notes = []
        for tok in extras:
            if tok.startswith("-"):
                close = difflib.get_close_matches(tok.split("=", 1)[0], options, n=3,
                                                  cutoff=0.6)
                if close:
                    notes.append(f"{tok}: did you mean {' or '.join(close)}?")
        msg = "unrecognized arguments: " + " ".join(extras)
        self.error(msg + ("\n" + "\n".join(notes) if notes else ""))


def command_parser(root: argparse.ArgumentParser, args: argparse.Namespace
                   ) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` names (`repro check`: the `check` parser)."""
    parser = root
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return parser
        name = getattr(args, subs[0].dest or "", None)
        if name is None or name not in subs[0].choices:
            return parser
        parser = subs[0].choices[name]


def suggest_command(root: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """An unknown command word: the closest commands, with the top-level usage (exit 2)."""
    import difflib

    subs = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    word = next((a for a in argv if not a.startswith("-")), None)
    if not subs or word is None or word in subs[0].choices or argv[0] != word:
        return
    close = difflib.get_close_matches(word, list(subs[0].choices), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    root.error(f"unknown command {word!r}{hint}; `paramsurgery -h` lists them")


def add_inputshape_arg(parser: argparse.ArgumentParser) -> None:
    """The shared `--inputshape` flag: one value per flag (repeatable), or `NAME=[..]`
    items up to the next flag (`normalize_argv`); one value may hold several specs."""
    parser.add_argument("--inputshape", action="append", metavar="NAME=[d0,...]",
                        help="shape of an input blob in numpy order of the ncnn.Mat "
                             "([c,h,w]); dims are integers or symbols such as T "
                             "(e.g. in0=[T,1024]); repeatable, or several NAME=[..] after "
                             "one flag")


def add_inputshape_args(parser: argparse.ArgumentParser, *, inputs: bool = True) -> None:
    """`--inputshape` (shapes of input blobs, symbolic dims allowed) and, for commands that
    run the graph, `--inputs inputs.npz` (arrays keyed by input blob name)."""
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
    from paramsurgery.core.fs import atomic_write
    from paramsurgery.formats.io import param_bytes

    data = param_bytes(g, out)  # a .param.bin output stays binary
    if out == "-":
        sys.stdout.buffer.write(data)
    else:
        atomic_write(out, data)
        print(note.format(out=out), file=sys.stderr)
