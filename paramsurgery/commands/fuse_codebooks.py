"""`paramsurgery fuse-codebooks`: N Embeds (one id input each) whose rows are summed -> one
Embed over the concatenated tables; writes .fused.param/.bin/.json

Fuse N Embed lookups (same num_output, one id input each) whose outputs are summed (BinaryOp
adds, Eltwise SUM, stack+sum) into one Embed over the concatenated tables with one id input,
and sum the rows in the graph (Reshape + Reduction on the float embeddings). The caller adds
each group's offset and flattens the ids group-major: ids[g*T+t] = code[g][t] + offsets[g]
(the .json manifest says so). --split: the form without the sum, one Embed + Slice giving
each group's rows under the old names.
"""

from __future__ import annotations

import argparse
import os

from paramsurgery.core.errors import VerificationError
from paramsurgery.ir.graph import Graph
from paramsurgery.commands._common import add_input_arg, command
from paramsurgery.commands._runner import Check, GraphCommand, PassLike, Outputs, Run, Writer, add_bin_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__)
    add_input_arg(p)
    add_bin_arg(p, positional=True)
    p.add_argument("-o", "--output", metavar="PREFIX", help="write PREFIX.param, PREFIX.bin, "
                   "PREFIX.json (default: <input>.fused)")
    p.add_argument("--split", action="store_true", help="no sum: one Embed + Slice into the "
                   "groups' original output blobs")
    p.add_argument("--embeds", help="comma-separated Embed layers to fuse (split mode: the "
                   "group; sum mode: only sums over these)")
    p.add_argument("--input-name", help="name of the fused id input (default: the first "
                   "group's id input)")
    p.add_argument("--name", help="name of the fused Embed layer (default embed_fused)")
    p.add_argument("--no-verify", action="store_true", help="skip the ncnn parity check")
    p.add_argument("--lengths", default="1,7,13", help="frames per group for the check "
                   "(default 1,7,13)")
    p.add_argument("--tol", type=float, default=1e-6, help="relative tolerance (default 1e-6)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random codes")
    from paramsurgery.commands._common import add_inputshape_args

    add_inputshape_args(p, inputs=False)
    run.finish(p, explain="say why candidates were left alone")


def default_prefix(param: str) -> str:
    """`X.ncnn.param` → `X.fused.ncnn` (`X.param` → `X.fused`)."""
    stem = param[: -len(".param")] if param.endswith(".param") else param
    return stem[: -len(".ncnn")] + ".fused.ncnn" if stem.endswith(".ncnn") else stem + ".fused"


def untouched_weights(before, after) -> tuple[int, list[str]]:
    """(layers whose weights are identical by sha256, names whose weights differ) over the
    layers present in both graphs."""
    from paramsurgery.formats.weights import weights_fingerprint

    a = {k.split("#")[0]: v for k, v in weights_fingerprint(before).items()}
    b = {k.split("#")[0]: v for k, v in weights_fingerprint(after).items()}
    common = [k for k in b if k in a]
    return sum(a[k] == b[k] for k in common), [k for k in common if a[k] != b[k]]


class FuseCodebooksCommand(GraphCommand):
    tag, prefix, extra, refusal = "fused", True, {"json": ".json"}, "parity failed"

    def default_prefix(self, param: str) -> str:
        return default_prefix(param)

    def make_pass(self, args: argparse.Namespace) -> PassLike:
        from paramsurgery.passes.fuse_codebooks import FuseCodebooks

        from paramsurgery.commands._common import inputshape_of

        return FuseCodebooks(mode="split" if args.split else "sum", embeds=args.embeds,
                             input_name=args.input_name, layer_name=args.name,
                             inputshape=inputshape_of(args))

    def prepare(self, args: argparse.Namespace, g: Graph) -> None:
        from paramsurgery.commands._common import inputshape_of

        inputshape_of(args, g)  # --inputshape names blobs of this graph

    def before_write(self, run: Run) -> None:
        """Name the files in the manifest; refuse weights the pass should not have touched."""
        args, out = run.args, run.out
        manifest = run.result.data["manifest"]
        manifest.param = os.path.basename(out.param)
        manifest.bin = os.path.basename(out.bin) if out.bin else None
        manifest.source_param = os.path.basename(args.param)
        manifest.source_bin = os.path.basename(args.bin) if args.bin else None
        same, differ = untouched_weights(run.source, run.graph) if args.bin else (0, [])
        if differ:  # the pass never edits them; refuse rather than write a surprise
            raise VerificationError(f"weights of untouched layers changed: {', '.join(differ)}",
                                    file=args.param)
        run.result.data["untouched_identical"] = same

    def extra_writers(self, run: Run) -> dict[str, Writer]:
        text = run.result.data["manifest"].dumps().encode("utf-8")
        return {"json": lambda fh: fh.write(text)}

    def checks(self, run: Run) -> bool:
        return bool(run.args.bin) and not run.args.no_verify  # checked unless --no-verify

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        from paramsurgery.verify.codebooks import verify_fusion

        args = run.args
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
        assert staged.bin is not None  # the fused table is written with the weights
        return verify_fusion(args.param, args.bin, staged.param, staged.bin,
                             run.result.data["manifest"], lengths=lengths, seed=args.seed,
                             tol=args.tol)

    def json(self, run: Run) -> dict:
        check = run.check
        return {"outputs": run.out.all(), "manifest": run.result.data["manifest"].to_json(),
                "untouched_weights_identical":
                    run.result.data["untouched_identical"] if run.args.bin else None,
                "parity": None if check is None else {"ok": check.ok, "max_rel": check.blobs}}

    def text(self, run: Run) -> list[str]:
        manifest = run.result.data["manifest"]
        lines = [f"  {f.embed}: input {f.input!r} = {len(f.groups)} groups x T ids, "
                 f"group-major, offsets {f.offsets}; " +
                 (f"output {f.output!r} (sum)" if f.mode == "sum" else
                  "outputs " + ", ".join(g.output for g in f.groups))
                 for f in manifest.fusions]
        if run.args.bin:
            lines.append(f"weights: fused table(s) {', '.join(f.dtype for f in manifest.fusions)}; "
                         f"{run.result.data['untouched_identical']} untouched layer(s) keep "
                         f"identical bytes (sha256)")
        return lines


run = FuseCodebooksCommand()
