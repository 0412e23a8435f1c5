"""Helpers shared by the CLI subcommands."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from typing import Any, Iterator, Sequence

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
    """Run a parsed command; with `--report`, through the before/after page. First the
    shared conventions: `-` as the model reads stdin (`stdin_models`), the positional
    `.bin` alias and `--bin` become one `args.bin` (`resolve_bin`)."""
    with stdin_models(args):
        resolve_bin(args)
        if getattr(args, "report", None):
            from paramsurgery.view.report import run_with_report

            return run_with_report(args, args.run)
        return args.run(args)


STDIN_NAME = "<stdin>"


def resolve_bin(args: argparse.Namespace) -> None:
    """`--bin B` and the positional `.bin` (kept as an alias where a command had one) are
    the same argument: given both, they must agree."""
    if not hasattr(args, "bin_positional"):
        return
    pos = args.bin_positional
    if pos is not None:
        if getattr(args, "bin", None) not in (None, pos):
            raise ParamSurgeryError(f"the weights are given twice ({pos} and --bin "
                                    f"{args.bin}); give one", file=getattr(args, "param", None))
        args.bin = pos
    if getattr(args, "bin_required", False) and not getattr(args, "bin", None):
        param = getattr(args, "param", None)
        raise ParamSurgeryError("this command needs the weights (--bin model.bin)",
                                file=param if isinstance(param, str) else None)


class _Renaming:
    """A text stream that writes `old` as `new` (a temporary stdin copy's path as
    `<stdin>`); everything else is the wrapped stream's."""

    def __init__(self, inner: Any, old: str, new: str) -> None:
        self._inner, self._old, self._new = inner, old, new

    def write(self, text: str) -> int:
        return self._inner.write(text.replace(self._old, self._new))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def stdin_models(args: argparse.Namespace) -> Iterator[None]:
    """`-` as the model: stdin is read (up to 64 MB, like any pipe) into a temporary file
    that the command reads, runs and links like any other; the reports call it `<stdin>`,
    and the default output is stdout (there is no "beside the input")."""
    attr = "a" if getattr(args, "command", None) == "diff" else "param"  # diff: A B
    model: Any = getattr(args, attr, None)
    many = isinstance(model, list)
    names: list[Any] = list(model) if many else [model]
    if "-" not in names:
        yield
        return
    if names.count("-") > 1:
        raise ParamSurgeryError("stdin ('-') can be read once")
    if getattr(args, "in_place", False):
        raise ParamSurgeryError("--in-place needs a file, not stdin", file=STDIN_NAME)
    import tempfile

    from paramsurgery.core.fs import MAX_STREAM_BYTES

    data = sys.stdin.buffer.read(MAX_STREAM_BYTES + 1)
    if len(data) > MAX_STREAM_BYTES:
        raise ParamSurgeryError(f"longer than {MAX_STREAM_BYTES} bytes", file=STDIN_NAME)
    with tempfile.TemporaryDirectory(prefix="paramsurgery-stdin-") as tmp:
        from paramsurgery.formats.param_text import BINARY_MAGIC

        path = os.path.join(tmp, "stdin.param.bin" if data[:4] == BINARY_MAGIC else
                            "stdin.param")
        with open(path, "wb") as fh:
            fh.write(data)
        setattr(args, attr, [path if n == "-" else n for n in names] if many else path)
        _stdin_copies.append(path)
        saved = sys.stdout, sys.stderr
        sys.stdout = _Renaming(sys.stdout, path, STDIN_NAME)  # type: ignore[assignment]
        sys.stderr = _Renaming(sys.stderr, path, STDIN_NAME)  # type: ignore[assignment]
        try:
            yield
        except ParamSurgeryError as exc:
            if exc.file == path:
                exc.file = STDIN_NAME
            exc.message = exc.message.replace(path, STDIN_NAME)
            raise
        finally:
            sys.stdout, sys.stderr = saved
            _stdin_copies.remove(path)


_stdin_copies: list[str] = []  # the temporary files holding a model read from stdin


def is_stdin(path: Any) -> bool:
    """Whether `path` is the copy of a model read from stdin (its outputs go to stdout)."""
    return path in _stdin_copies


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


def default_output(args: argparse.Namespace, tag: str) -> str:
    """The one default-output rule: `-o PATH` (`-`: stdout), `--in-place`, else
    `<input>.<tag>.param` beside the input (stdout when the input is stdin)."""
    if args.output is None and not getattr(args, "in_place", False):
        args.output = derived_output(args.param, tag)
    out = output_path(args, args.param)
    assert out is not None
    return out


def print_json(data: Any, stream: Any = None) -> None:
    """A command's JSON report (stdout, or `stream`): one object, of the command's schema
    (`commands/_schemas.py`, README "JSON output")."""
    out = stream if stream is not None else sys.stdout
    json.dump(data, out, indent=2, sort_keys=False)
    out.write("\n")


def file_list(*entries: tuple[str, Any]) -> list[dict[str, str]]:
    """The `files` list of a JSON report: one `{"file": path, "role": role}` per
    (role, path) entry, in order; an entry without a path (a file not given or not
    written) is left out."""
    return [{"file": str(path), "role": role} for role, path in entries if path]


def derived_output(input_path: str, tag: str) -> str:
    """`model.param` → `model.<tag>.param` (next to the input); `-` (stdout) for a model
    read from stdin."""
    if is_stdin(input_path):
        return "-"
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
    add_input_arg(parser)
    add_output_args(parser, f"output .param (default: <input>.{tag}.param)")
    add_weights_arg(parser, "its weights (.bin): checked against the graph, then rewritten "
                            "next to the output when the pass changes a weighted layer, else "
                            "linked (or copied)")
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
        self._argv = list(args) if args is not None else []
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:  # type: ignore[override]
        # argparse checks required arguments before it reports unknown options: a typo of
        # an option (`--layr`) would read "one of --layer --type is required"; name the
        # typo first, with its close matches
        if message.startswith(("the following arguments are required",
                               "one of the arguments")):
            unknown = self._unknown_options()
            if unknown:
                self.unknown_option_error(unknown)
        super().error(message)

    def _unknown_options(self) -> list[str]:
        """Tokens of the last parse that look like options and are none of this parser's
        (nor a prefix argparse would accept for exactly one)."""
        options = [o for a in self._actions for o in a.option_strings]
        unknown = []
        for tok in getattr(self, "_argv", []):
            if tok == "--":
                break
            if (not tok.startswith("-") or tok == "-" or _NEGATIVE_ASSIGN_RE.match(tok)
                    or tok[1:2].isdigit() or tok[1:2] == "."):
                continue
            head = tok.split("=", 1)[0]
            if head in options or (head.startswith("--") and
                                   len([o for o in options if o.startswith(head)]) == 1):
                continue
            unknown.append(tok)
        return unknown

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
                close = difflib.get_close_matches(tok.split("=", 1)[0], options, n=2,
                                                  cutoff=0.75)
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


def add_inputshape_at_args(parser: argparse.ArgumentParser, at_help: str) -> None:
    """`--inputshape` and `--at SYM=N` (repeatable) binding its symbols, for a command that
    runs the graph at one concrete shape (`concrete_inputshape`)."""
    add_inputshape_arg(parser)
    parser.add_argument("--at", action="append", default=[], metavar="SYM=N", help=at_help)


def concrete_inputshape(args: argparse.Namespace, graph: Any) -> dict | None:
    """`--inputshape` with its symbols bound by `--at` (default: the oracle's base value)."""
    from paramsurgery.analysis.shapes.affine import evaluate
    from paramsurgery.analysis.shapes.oracle import DEFAULT_VALUES

    shapes = inputshape_of(args, graph)
    if not shapes:
        return None
    env: dict[str, int] = {}
    for item in args.at:
        sym, eq, val = item.partition("=")
        try:
            env[sym.strip()] = int(val)
        except ValueError:
            raise ParamSurgeryError(f"--at {item!r}: expected SYM=N") from None
        if not eq:
            raise ParamSurgeryError(f"--at {item!r}: expected SYM=N")
    out = {}
    for blob, dims in shapes.items():
        syms = [s for d in dims for s in getattr(d, "symbols", ())]
        full = {s: env.get(s, DEFAULT_VALUES[0]) for s in syms}
        out[blob] = tuple(evaluate(d, full) for d in dims)
        if any(d <= 0 for d in out[blob]):
            raise ParamSurgeryError(f"--inputshape {blob}: not positive at {full}")
    return out


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
                  name: str = "param", nargs: Any = None) -> None:
    """The graph a command reads (positional `param`; `-` reads stdin)."""
    p.add_argument(name, nargs=nargs, help=f"{what} ('-': stdin)" if name == "param" else what)


def add_weights_arg(p: argparse.ArgumentParser, what: str, *, positional: bool = False,
                    required: bool = False) -> None:
    """`--bin B` (and, with `positional`, the positional `.bin` after the model as its
    alias): one weights argument on every command (`resolve_bin`)."""
    if positional:
        p.add_argument("bin_positional", nargs="?", metavar="BIN",
                       help="the same as --bin (kept as a positional alias)")
    p.add_argument("--bin", metavar="BIN", help=what)
    if required:
        p.set_defaults(bin_required=True)


def write_graph(g: Any, out: str, note: str | None) -> None:
    """Write `g`'s text to `out` (atomically; '-' = stdout); then `note` (a format string
    of `out`; None: nothing) on stderr says what was written."""
    from paramsurgery.formats.io import param_bytes, save

    if out == "-":
        sys.stdout.buffer.write(param_bytes(g, out))
    else:
        save(g, out)  # a .param.bin output stays binary, its names in x.id.h beside it
        if note is not None:
            print(note.format(out=out), file=sys.stderr)
