"""A pass's options as data: a pass is a frozen dataclass whose fields are its options
(xDSL's habit), and each field says how its command takes it — flag, help, metavar, and
what turns the flag's text into the value (`load`: a file read by the command, never by the
pass) or gives it when the flag is absent (`beside_input`: a file found next to the input).
The command line is built from these fields in `commands/_pass_commands.py`; no pass
imports argparse.

    class KeepPrecision(Pass, name="keep-precision", summary="...", tag="keepprec"):
        layers: tuple[str | int, ...] = option(default=(), flag="--layer", help="a layer to keep")
        mode: str = option(default="fp16", help="...", choices=("fp16", "bf16"))

The class statement declares the pass (`Pass.__init_subclass__` registers it and makes it a
frozen dataclass). A default is given as `default=`: type checkers read a field's default
from that keyword only (PEP 681), so a positional one would make the field look required.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

OPTION = "paramsurgery.option"  # the field metadata key


@dataclass(frozen=True)
class Option:
    """How a pass field is given on the command line (None: not a flag, e.g. an input only
    the Python API or `fix` hands over)."""

    help: str
    flag: str | None = None  # default: --field-name
    metavar: str | None = None
    choices: Sequence[str] | None = None
    required: bool = False
    repeat: bool = False  # the flag may be given several times (a tuple field)
    many: bool = False  # the flag takes one or more values (`--only a b`; a tuple field)
    negate: bool = False  # a bool field that defaults to True: `--no-<name>` turns it off
    load: Callable[[str], Any] | None = None  # the flag's text -> the value (reads a file)
    beside_input: Callable[[str], Any] | None = None  # the input path -> the default value


def option(*, default: Any = dataclasses.MISSING, help: str, **how: Any) -> Any:
    """A pass option: a dataclass field with its command-line form (see `Option`)."""
    meta = {OPTION: Option(help, **how)}
    if isinstance(default, (list, dict, set)):
        raise TypeError("a pass option's default must be immutable (a tuple, not a list)")
    return dataclasses.field(default=default, metadata=meta)


def internal(*, default: Any = None) -> Any:
    """A field that is not a flag: given by the Python API or `fix` (its `for_fix`)."""
    return dataclasses.field(default=default)


def options_of(cls: type) -> list[tuple[dataclasses.Field, Option]]:
    """The fields of a pass class that are command-line options, in declaration order."""
    if not dataclasses.is_dataclass(cls):
        return []
    return [(f, f.metadata[OPTION]) for f in dataclasses.fields(cls) if OPTION in f.metadata]


def flag_of(f: dataclasses.Field, opt: Option) -> str:
    if opt.flag:
        return opt.flag
    name = f.name.replace("_", "-")
    return f"--no-{name}" if opt.negate else f"--{name}"


def loaded_ops(what: str, value: Any) -> list | None:
    """pnnx's ops given to a pass, as a list; a path is refused (TypeError): a pass reads no
    file, the command or `fix` does (`formats.pnnx_traced.load_traced`)."""
    if isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what}: give pnnx's ops (formats.pnnx_traced.load_traced(path)), "
                        f"not a path: a pass reads no file")
    return list(value) if value is not None else None
