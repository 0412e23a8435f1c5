"""`paramsurgery rewrite`: apply rewrite rules written in the .param format (a pattern and
its replacement), proven through ncnn

Each `--rule FILE` holds a `pattern` section and a `replacement` section of param lines
(`%name` blobs are carried across; see README "Rewrite rules"). The result is run through
ncnn next to the input at every input shape (`--inputshape` with a symbol runs at each of
`--lengths`; the Input layers' own shapes otherwise) and written only when every output
agrees; `--no-verify` writes it unproven and says so.
"""

from __future__ import annotations

import argparse
from typing import Any

from paramsurgery.commands._common import add_inputshape_args, add_input_arg, add_output_args, command
from paramsurgery.commands._runner import (Check, GraphCommand, Outputs, PassLike, Run, add_bin_arg,
                                           prove_equivalent)
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.ir.graph import Graph


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__)
    add_input_arg(p)
    add_output_args(p, "output .param (default: <input>.rewrite.param)")
    add_bin_arg(p)
    p.add_argument("--rule", action="append", required=True, metavar="RULE",
                   help="a rule file (repeatable; applied in order, each to a fixed point)")
    add_inputshape_args(p)
    p.add_argument("--lengths", default="7,13",
                   help="the values each --inputshape symbol is run at (default 7,13)")
    p.add_argument("--tol", type=float, default=1e-5,
                   help="relative tolerance of the proof (default 1e-5)")
    p.add_argument("--no-verify", action="store_true",
                   help="write without running the proof (the report says it is unproven)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs")
    run.finish(p, explain="show each rule's best near-miss when it never matched")


class RewriteCommand(GraphCommand):
    tag, bin_note, verify_needs_bin = "rewrite", True, False
    refusal = "the rewritten graph is not proven equal; nothing written"

    def make_pass(self, args: argparse.Namespace) -> PassLike:
        from paramsurgery.passes.rewrite import Rewrite
        from paramsurgery.patterns.rule_file import read_rule_file

        return Rewrite(rules=[read_rule_file(path) for path in args.rule])

    def prepare(self, args: argparse.Namespace, g: Graph) -> None:
        from paramsurgery.commands._common import inputshape_of
        from paramsurgery.formats.weights.schema import reads_for

        inputshape_of(args, g)
        if args.no_verify or args.bin:
            return
        weighted = next((layer for layer in g
                         if any(r.count > 0 for r in reads_for(layer.type, layer.params) or [])),
                        None)
        if weighted is not None:
            raise ParamSurgeryError(f"the proof runs the weights, and {weighted.type} "
                                    f"{weighted.name!r} has some: give --bin (or --no-verify to "
                                    f"write the rewrite unproven)", file=args.param,
                                    line=weighted.source_line)

    def checks(self, run: Run) -> bool:
        return not run.args.no_verify  # proven unless --no-verify

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        if not run.result.modified:
            return None
        return prove_equivalent(run.args, staged, run.args.param, run.args.bin)

    def unproven(self, run: Run) -> str | None:
        return None  # proven by default; its own line (in `text`) says when it was not

    def text(self, run: Run) -> list[str]:
        if run.result.modified and run.args.no_verify:
            return ["NOT PROVEN: --no-verify: the rewritten graph was not run against the input"]
        return []

    def json(self, run: Run) -> dict[str, Any]:
        check = run.check
        return {"fired": run.result.data.get("fired", {}),
                "proven": check is not None and check.ok,
                "verify": None if check is None else {"ok": check.ok, "rel": check.rel,
                                                      "envs": check.envs}}


run = RewriteCommand()
