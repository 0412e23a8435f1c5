"""`paramsurgery set-param`: set / unset params of layers picked by name or type, typed by what
ncnn reads (checked by ncnn's load_param)

Typed param overrides: ID is a param id, its array key or its name (axis, kv_cache, ...);
VALUE is typed by the layer's load_param (a float param set to 1 is written 1.0).
"""

from __future__ import annotations

import argparse
import re

from paramsurgery.commands._common import add_pass_args, command

# a token that is an assignment, not a layer name / type: `0=1`, `-23300=2,1,2`, `axis=-1`
_ASSIGN_RE = re.compile(r"^(-?[0-9]+|[a-z_][a-z0-9_]*)=")


def intermixed(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Let positional ID=VALUE tokens follow options (`--where 0=2 0=1`)."""
    orig = parser.parse_known_args
    busy: list[int] = []

    def parse_known_args(args=None, namespace=None):
        if busy:
            return orig(args, namespace)
        busy.append(1)
        try:
            return parser.parse_known_intermixed_args(args, namespace)
        finally:
            busy.pop()

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    return parser


def take_assignments(args: argparse.Namespace, *names: str) -> None:
    """`--layer a b 0=1` gives nargs='+' everything; move the ID=VALUE tokens back."""
    for name in names:
        vals = getattr(args, name, None)
        if not vals:
            continue
        keep = [v for v in vals if not _ASSIGN_RE.match(v)]
        args.assignments.extend(v for v in vals if _ASSIGN_RE.match(v))
        setattr(args, name, keep)


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run)
    add_pass_args(p, "set")
    p.add_argument("assignments", nargs="*", metavar="ID=VALUE",
                   help="params to set; negative ids (array keys, -23310=1,0.2) work as written "
                        "(`--` also ends the options)")
    sel = p.add_mutually_exclusive_group(required=True)
    sel.add_argument("--layer", nargs="+", metavar="NAME", help="layers by name")
    sel.add_argument("--type", nargs="+", metavar="TYPE", help="every layer of these types")
    p.add_argument("--where", action="append", default=[], metavar="ID=VALUE",
                   help="only layers whose param ID currently equals VALUE (absent = ncnn's "
                        "default); repeatable")
    p.add_argument("--unset", nargs="+", default=[], metavar="ID",
                   help="remove params (ncnn then uses its default)")
    p.add_argument("--force", action="store_true",
                   help="allow ids the layer type does not read and edits that change its "
                        ".bin reads (ncnn's load_param check still runs)")
    intermixed(p)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.set_param import SetParam

    take_assignments(args, "layer", "type", "unset")
    from paramsurgery.commands._runner import run_param_pass

    return run_param_pass(args, "set", lambda: SetParam(args.assignments, layers=args.layer or (),
                                                        types=args.type or (), unset=args.unset,
                                                        where=args.where, force=args.force))
