"""Commands declared by the passes themselves: every registered pass with a `tag` and no
module of its own in commands/ becomes `paramsurgery <name>`, which loads the input, runs the
pass on a copy, writes `<input>.<tag>.param` (or -o) atomically and reports (the shared
runner, `run_param_pass`). Its flags are the pass's own option fields
(`passes/options.py`): the pass is data, the command line is built here. Adding such a pass
touches its file, its case files and README."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Container

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.passes.options import flag_of, options_of


def register_pass_commands(sub: argparse._SubParsersAction, taken: Container[str]) -> None:
    from paramsurgery.passes.base import Pass, all_passes

    for name, cls in all_passes().items():
        if cls.tag is None or name in taken:
            continue
        p = sub.add_parser(name, help=cls.summary, description=cls.summary)
        add_pass_args(p, cls.tag)
        add_option_args(p, cls)
        add_equivalence_args(p)

        def run(args: argparse.Namespace, cls: type[Pass] = cls, tag: str = cls.tag) -> int:
            return run_param_pass(args, tag, lambda: pass_from_args(cls, args))

        p.set_defaults(run=run)


def add_equivalence_args(p: argparse.ArgumentParser) -> None:
    """`--verify` on every declared pass: the result against the input through ncnn
    (`prove_equivalent`) at lengths no trace used, before anything is written."""
    from paramsurgery.commands._common import add_inputshape_args
    from paramsurgery.commands._runner import add_verify_args

    add_verify_args(p, "run the rewritten graph and the input through ncnn on the same inputs "
                       "(each --inputshape symbol at every --lengths value)", tol=1e-4)
    p.add_argument("--lengths", default="5,11", help="--verify: values of the shape symbols")
    p.add_argument("--seed", type=int, default=0, help="--verify: seed of the random inputs")
    add_inputshape_args(p)


def add_option_args(p: argparse.ArgumentParser, cls: type) -> None:
    """One flag per option field of the pass class."""
    for f, opt in options_of(cls):
        kw: dict[str, Any] = {"dest": f.name, "help": opt.help}
        if f.type in (bool, "bool"):
            kw["action"] = "store_false" if opt.negate else "store_true"
        else:
            # a number field is parsed by argparse: bad text is its usage error (exit 2),
            # and the pass receives the value with its declared type
            declared = getattr(f.type, "__name__", f.type)  # "int", or "int | None"
            if isinstance(declared, str) and declared.endswith(" | None"):
                declared = declared[:-len(" | None")]
            number = {"int": int, "float": float}.get(declared)
            if number is not None:
                kw["type"] = number
            if opt.metavar:
                kw["metavar"] = opt.metavar
            if opt.choices:
                kw["choices"] = list(opt.choices)
            if opt.repeat:
                kw["action"], kw["default"] = "append", []
            elif opt.many:
                kw["nargs"], kw["default"] = "+", []
            kw["required"] = opt.required
        p.add_argument(flag_of(f, opt), **kw)


def pass_from_args(cls: type, args: argparse.Namespace) -> Any:
    """The pass instance from its flags: each option's value (loaded from its file by
    `load`, or found beside the input when the flag is absent); the weights first when the
    pass needs them."""
    if getattr(cls, "needs_weights", False) and not getattr(args, "bin", None):
        raise ParamSurgeryError(f"{cls.name} needs the weights (--bin model.bin)",  # type: ignore[attr-defined]
                                file=args.param)
    return cls(**option_values(cls, args))


def option_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The values of the pass's option fields given by the flags (a field whose flag is
    absent is left out: its own default), for a command that adds inputs of its own."""
    values: dict[str, Any] = {}
    for f, opt in options_of(cls):
        value = getattr(args, f.name, None)
        if opt.repeat or opt.many:
            value = tuple(value or ())
        if value is None and opt.beside_input is not None:
            value = opt.beside_input(args.param)
        elif value is not None and opt.load is not None:
            value = opt.load(value)
        if value is None and f.default is not dataclasses.MISSING:
            continue  # the field's own default
        values[f.name] = value
    return values
