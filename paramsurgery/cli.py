"""The `paramsurgery` command line.

Each subcommand lives in its own module under `paramsurgery/commands/` and exposes
`register(subparsers)`, which adds its parser with `set_defaults(run=<function>)`; the
function returns the exit code. Modules are discovered, so adding a command touches no
shared file. A pass that sets `tag` declares its own command in its pass file
(`commands/_pass_commands.py`). Errors a user can cause print `file:line:col: message` and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from typing import TYPE_CHECKING, Sequence

from paramsurgery import __version__
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.core.fs import Terminated, signals_raise

if TYPE_CHECKING:
    from paramsurgery.core import progress


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser. Given the command line, only the command it names is imported and
    registered (command `foo-bar` lives in `commands/foo_bar.py`, or is declared by the pass
    `foo-bar`): starting the CLI costs one command module, not all of them (`--version`
    none). Without one (help, a typo) every command is."""
    parser = argparse.ArgumentParser(
        prog="paramsurgery",
        description="Exact, verified graph surgery on ncnn models (.param / .param.bin / .bin).")
    parser.add_argument("--version", action="version", version=f"paramsurgery {__version__}")
    from paramsurgery import commands
    from paramsurgery.commands._common import CommandParser

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)

    names = sorted(info.name for info in pkgutil.iter_modules(commands.__path__)
                   if not info.name.startswith("_"))
    word = next((a for a in argv or () if not a.startswith("-")), None)
    wanted = word.replace("-", "_") if word is not None else None
    if wanted in names and argv is not None and argv[0] == word:
        names = [wanted]
    elif word is not None and argv is not None and argv[0] == word:
        from paramsurgery.commands._pass_commands import register_pass_commands

        # a command a pass declares (no module of its own): only the passes load
        register_pass_commands(sub, {n.replace("_", "-") for n in names})
        if word in sub.choices:
            return parser
    elif word is None and argv and "--version" in argv and not {"-h", "--help"} & set(argv):
        names = []  # argparse prints the version before it would look at a command
    for name in names:
        importlib.import_module(f"{commands.__name__}.{name}").register(sub)
    if len(names) > 1:  # not just the named command module: passes may declare commands too
        from paramsurgery.commands._pass_commands import register_pass_commands

        register_pass_commands(sub, sub.choices)  # (those registered above are skipped)
    return parser


def main(argv: Sequence[str] | None = None,
         parser: argparse.ArgumentParser | None = None) -> int:
    """Run one command; `parser` (from build_parser) may be reused across calls."""
    from paramsurgery.commands._common import command_parser, normalize_argv, suggest_command

    argv = normalize_argv(sys.argv[1:] if argv is None else argv)
    parser = parser or build_parser(argv)
    suggest_command(parser, argv)
    args, extras = parser.parse_known_args(argv)
    if extras:  # the command's own usage and the closest options, not the top-level usage
        sub = command_parser(parser, args)
        if hasattr(sub, "unknown_option_error"):
            sub.unknown_option_error(extras)
        parser.error("unrecognized arguments: " + " ".join(extras))
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    from paramsurgery.commands._common import run_command
    from paramsurgery.core import progress

    _line_buffered()
    reporter = progress.Reporter()
    try:
        with signals_raise(), progress.use_console(
                stream=sys.stdout, quiet=bool(getattr(args, "quiet", False)),
                machine=getattr(args, "format", None) == "json") as reporter:
            code = run_command(args)
    except ParamSurgeryError as exc:
        print(f"{exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(_stopped("interrupted", reporter), file=sys.stderr)
        return 130
    except Terminated as exc:
        print(_stopped(f"terminated (signal {exc.signum})", reporter), file=sys.stderr)
        return 128 + exc.signum
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.filename is None:
            return _internal_error(exc)
        # the environment refused a file operation (permissions, disk full, ...): not a bug
        print(f"{exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - last line of defence: no traceback for users
        return _internal_error(exc)
    return int(code or 0)


def _line_buffered() -> None:
    """stdout is flushed at each line (a report streams through a pipe as it is made)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(line_buffering=True)
        except (ValueError, OSError):  # a closed or detached stream: leave it
            pass


def _stopped(what: str, reporter: "progress.Reporter") -> str:
    """`terminated (signal 15); finished: kv-cache parity: 3 of 6 run(s)` (what was done;
    the finished lines themselves were printed as they came)."""
    done = reporter.interrupted()
    return what + ("; finished: " + "; ".join(done) if done else "")


def _internal_error(exc: Exception) -> int:
    if os.environ.get("PARAMSURGERY_DEBUG"):
        raise exc
    print(f"paramsurgery: internal error: {type(exc).__name__}: {exc} "
          f"(set PARAMSURGERY_DEBUG=1 for a traceback; please report it)", file=sys.stderr)
    return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
