"""`paramsurgery add-kvcache`: inject ncnn's native kv cache into attention layers."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_output_args
from paramsurgery.commands._runner import (Check, GraphCommand, PassLike, Outputs, Run, add_bin_arg,
                                           add_verify_args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("add-kvcache", help="add ncnn's native kv cache to SDPA / "
                       "MultiHeadAttention layers (4->6 bottoms, 1->3 tops, 7=1)")
    p.add_argument("param", help="input .param (a decoder exported without cache)")
    add_output_args(p, "output .param (default: <input>.kvcache.param)")
    add_bin_arg(p)
    from paramsurgery.commands._pass_commands import add_option_args
    from paramsurgery.passes.kvcache import AddKVCache

    add_option_args(p, AddKVCache)  # --naming ... --dynamic-gemm: the pass's option fields
    add_verify_args(p, "prove parity through ncnn (needs --bin)", tol=1e-5)
    p.add_argument("--n", type=int, default=8, help="--verify: prefill length (default 8)")
    p.add_argument("--m", type=int, default=4, help="--verify: single-token steps (default 4)")
    from paramsurgery.commands.verify_kvcache import add_decoder_io_args

    add_decoder_io_args(p)
    from paramsurgery.commands._common import add_inputshape_args

    add_inputshape_args(p)
    run.finish(p, explain="say why layers were left alone")


class AddKVCacheCommand(GraphCommand):
    tag, bin_note, refusal = "kvcache", True, "kv-cache parity failed"

    def make_pass(self, args: argparse.Namespace) -> PassLike:
        from paramsurgery.commands._pass_commands import pass_from_args
        from paramsurgery.passes.kvcache import AddKVCache

        return pass_from_args(AddKVCache, args)

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        from paramsurgery.verify.kvcache import verify_kvcache
        from paramsurgery.commands._common import inputshape_of
        from paramsurgery.commands.verify_kvcache import decoder_io_from_args

        args = run.args
        return verify_kvcache(staged.param, staged.bin, n=args.n, m=args.m, tol=args.tol,
                              io=decoder_io_from_args(args), seed=args.seed,
                              reference_param=args.param,
                              inputshape=inputshape_of(args) or None, inputs=args.inputs)

    def json(self, run: Run) -> dict:
        new, parity = run.graph, run.check
        return {"header": {"before": [len(run.source), run.source.blob_count()],
                           "after": [len(new), new.blob_count()]},
                "changes": _machine_changes(run),
                "cache": [s.__dict__ for s in run.result.data.get("slots", [])],
                "parity": None if parity is None else parity.to_json()}

    def unproven(self, run: Run) -> str | None:
        return None  # proven by default; its own line (in `text`) says when it was not

    def text(self, run: Run) -> list[str]:
        new, old = run.graph, run.source
        lines = [f"header: {len(old)} {old.blob_count()} -> {len(new)} {new.blob_count()}"]
        if run.result.modified and not run.args.verify:
            # exit 0 without the parity run: say so (the cache is proven only by --verify)
            lines.append("not proven: the cached decode was not run through ncnn (--verify "
                         "checks prefill + single steps against a full prefill; needs --bin)")
        return lines


def _machine_changes(run: Run) -> list[dict]:
    """The edits as values, not prose: each layer's bottom/top counts and blobs before and
    after, and the params set (`{"7": 1}`); an added layer's type and tops."""
    before = {layer.name: layer for layer in run.source}
    out = []
    for c in run.result.changes:
        new, old = run.graph.find(c.layer), before.get(c.layer)
        entry: dict = {"layer": c.layer, "what": c.what, "line": c.line}
        for key, layer in (("before", old), ("after", new)):
            entry[key] = None if layer is None else {
                "type": layer.type, "bottoms": list(layer.inputs), "tops": list(layer.outputs),
                "params": {str(k): v for k, v in layer.params.items()}}
        out.append(entry)
    return out


run = AddKVCacheCommand()
