"""`paramsurgery fuse-codebooks`: N codebook Embeds -> one offset Embed (+ manifest)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from ..errors import ParamSurgeryError, VerificationError
from ..io import load
from ._common import add_format_arg, add_report_arg, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fuse-codebooks",
        help="N Embeds (one id input each) whose rows are summed -> one Embed over the "
             "concatenated tables; writes .fused.param/.bin/.json",
        description="Fuse N Embed lookups (same num_output, one id input each) whose outputs "
                    "are summed (BinaryOp adds, Eltwise SUM, stack+sum) into one Embed over the "
                    "concatenated tables with one id input, and sum the rows in the graph "
                    "(Reshape + Reduction on the float embeddings). The caller adds each "
                    "group's offset and flattens the ids group-major: ids[g*T+t] = code[g][t] + "
                    "offsets[g] (the .json manifest says so). --split: the form without the "
                    "sum, one Embed + Slice giving each group's rows under the old names.")
    p.add_argument("param", help="input .param")
    p.add_argument("bin", nargs="?", help="its .bin (without it only .param and .json are "
                   "written and nothing is verified)")
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
    p.add_argument("--explain", action="store_true", help="say why candidates were left alone")
    from ._common import add_inputshape_args

    add_inputshape_args(p, inputs=False)
    add_format_arg(p)
    add_report_arg(p)
    p.set_defaults(run=run)


def output_paths(param: str, prefix: str | None) -> tuple[str, str, str]:
    if prefix is None:
        stem = param[: -len(".param")] if param.endswith(".param") else param
        stem = stem[: -len(".ncnn")] + ".fused.ncnn" if stem.endswith(".ncnn") else \
            stem + ".fused"
        prefix = stem
    elif prefix.endswith(".param"):
        prefix = prefix[: -len(".param")]
    return prefix + ".param", prefix + ".bin", prefix + ".json"


def untouched_weights(before, after) -> tuple[int, list[str]]:  # noqa: ANN001
    """(layers whose weights are identical by sha256, names whose weights differ) over the
    layers present in both graphs."""
    from ..weights import weights_fingerprint

    a = {k.split("#")[0]: v for k, v in weights_fingerprint(before).items()}
    b = {k.split("#")[0]: v for k, v in weights_fingerprint(after).items()}
    common = [k for k in b if k in a]
    return sum(a[k] == b[k] for k in common), [k for k in common if a[k] != b[k]]


def run(args: argparse.Namespace) -> int:
    from ..passes.fuse_codebooks import FuseCodebooks, verify_fusion

    param_out, bin_out, json_out = output_paths(args.param, args.output)
    for path in (param_out, bin_out, json_out):
        for src in (args.param, args.bin):
            if src and os.path.exists(path) and os.path.samefile(path, src):
                raise ParamSurgeryError(f"output {path} would overwrite the input", file=src)
    g = load(args.param, bin=args.bin)
    from ._common import inputshape_of

    result = FuseCodebooks(mode="split" if args.split else "sum", embeds=args.embeds,
                           input_name=args.input_name, name=args.name,
                           inputshape=inputshape_of(args, g))(g)
    fused = result.graph
    manifest = result.data["manifest"]
    manifest.param = os.path.basename(param_out)
    manifest.bin = os.path.basename(bin_out) if args.bin else None
    manifest.source_param = os.path.basename(args.param)
    manifest.source_bin = os.path.basename(args.bin) if args.bin else None
    same, differ = untouched_weights(g, fused) if args.bin else (0, [])
    if differ:  # the pass never edits them; refuse rather than write a surprise
        raise VerificationError(f"weights of untouched layers changed: {', '.join(differ)}",
                                file=args.param)
    outdir = os.path.dirname(os.path.abspath(param_out))
    check = None
    tmp = tempfile.mkdtemp(prefix=".fuse-codebooks.", dir=outdir)
    try:
        tp, tb, tj = (os.path.join(tmp, os.path.basename(x)) for x in
                      (param_out, bin_out, json_out))
        if args.bin:
            fused.save(tp, bin=tb)
        else:
            fused.save(tp)
        with open(tj, "w", encoding="utf-8") as fh:
            fh.write(manifest.dumps())
        if args.bin and not args.no_verify:
            lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
            check = verify_fusion(args.param, args.bin, tp, tb, manifest, lengths=lengths,
                                  seed=args.seed, tol=args.tol)
            if not check.ok:
                print(result.format(args.explain), file=sys.stderr)
                print(check.format(), file=sys.stderr)
                print(f"{args.param}: refusing to write {param_out}: parity failed",
                      file=sys.stderr)
                return 1
        for src, dst in ((tp, param_out), (tb, bin_out), (tj, json_out)):
            if os.path.exists(src):
                os.replace(src, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    written = [param_out] + ([bin_out] if args.bin else []) + [json_out]
    if args.format == "json":
        print_json({"outputs": written, "changes": [c.__dict__ for c in result.changes],
                    "skipped": [s.__dict__ for s in result.skipped],
                    "manifest": manifest.to_json(),
                    "untouched_weights_identical": same if args.bin else None,
                    "parity": None if check is None else {"ok": check.ok, "max_rel": check.blobs}})
        return 0
    print(result.format(args.explain))
    for f in manifest.fusions:
        print(f"  {f.embed}: input {f.input!r} = {len(f.groups)} groups x T ids, group-major, "
              f"offsets {f.offsets}; " + (f"output {f.output!r} (sum)" if f.mode == "sum" else
                                           "outputs " + ", ".join(g.output for g in f.groups)))
    if args.bin:
        print(f"weights: fused table(s) {', '.join(f.dtype for f in manifest.fusions)}; "
              f"{same} untouched layer(s) keep identical bytes (sha256)")
    if check is not None:
        print(check.format())
    print("wrote " + ", ".join(written))
    return 0
