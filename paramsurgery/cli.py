"""The `paramsurgery` command line.

Each subcommand lives in its own module under `paramsurgery/commands/` and exposes
`register(subparsers)`, which adds its parser with `set_defaults(run=<function>)`; the
function returns the exit code. Modules are discovered, so adding a command touches no
shared file. Errors a user can cause print `file:line:col: message` and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from typing import Sequence

from . import __version__
from .errors import ParamSurgeryError
from .io import Terminated, signals_raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paramsurgery",
        description="Exact, verified graph surgery on ncnn models (.param / .param.bin / .bin).")
    parser.add_argument("--version", action="version", version=f"paramsurgery {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from . import commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None,
         parser: argparse.ArgumentParser | None = None) -> int:
    """Run one command; `parser` (from build_parser) may be reused across calls."""
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    from .commands._common import run_command

    try:
        with signals_raise():
            code = run_command(args)
    except ParamSurgeryError as exc:
        print(f"{exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"terminated (signal {exc.signum})", file=sys.stderr)
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


def _internal_error(exc: Exception) -> int:
    if os.environ.get("PARAMSURGERY_DEBUG"):
        raise exc
    print(f"paramsurgery: internal error: {type(exc).__name__}: {exc} "
          f"(set PARAMSURGERY_DEBUG=1 for a traceback; please report it)", file=sys.stderr)
    return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
