"""Commands declared by the passes themselves: every registered pass with a `tag` and no
module of its own in commands/ becomes `paramsurgery <name>`, which loads the input, runs the
pass on a copy, writes `<input>.<tag>.param` (or -o) atomically and reports (the shared
runner, `run_param_pass`). Adding such a pass touches its file, its test and README."""

from __future__ import annotations

import argparse
from typing import Container

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass


def register_pass_commands(sub: argparse._SubParsersAction, taken: Container[str]) -> None:
    from paramsurgery.passes.base import Pass, all_passes

    for name, cls in all_passes().items():
        if cls.tag is None or name in taken:
            continue
        p = sub.add_parser(name, help=cls.summary, description=cls.summary)
        add_pass_args(p, cls.tag)
        cls.add_args(p)

        def run(args: argparse.Namespace, cls: type[Pass] = cls, tag: str = cls.tag) -> int:
            return run_param_pass(args, cls.from_args(args), tag)

        p.set_defaults(run=run)
