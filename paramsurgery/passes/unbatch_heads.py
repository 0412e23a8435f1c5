"""`unbatch-heads`: attention heads pnnx's dynamic export keeps in ncnn's batch axis → the
`[w=D, h=T, c=H]` blob ncnn's SDPA and RotaryEmbed take.

Under a dynamic export (`inputshape2`) pnnx infers the sequence axis T as ncnn's batch `n`
once a fused projection is split into heads (Phi-3's and GPT-NeoX's fused QKV); the layers
it then writes, down to a RotaryEmbed that rotates only the first head of a 4-D blob
(PS405), are drawn once in `patterns/batch_heads.py`, where `plan_heads` proves them.

The pass proves each SDPA input's heads from these layers and writes them as ncnn wants:
the head split out of n becomes 3-D (`6="R,0n,H"`: [R, T, H]), a batched blob gets the
same Reshape (`12=2 13=233 6="W,0n,H"`: the pass-through part before the Concat, or a head
the SDPA reads straight from the split, GPT-NeoX's v), and the Concat joins them on w
(`0=2`). The elements and the head order are the torch ones (the Reshape moving T out of
n is the transpose pnnx dropped); a Reshape `6="D,0h,H"` to the SDPA then keeps them.
Every other reader of a blob whose layout changes must only need its width/length (HF's
mask crop to the key length), else the SDPA is left alone with the reason. fold-gqa
uses the same proof for the k/v it folds (`plan_heads`, `apply_heads`).
"""

from __future__ import annotations

from paramsurgery.analysis.shape_expr import reshape_dims
from paramsurgery.core.changes import Change
from paramsurgery.core.match import MatchFailure
from paramsurgery.core.ncnn import NO_BATCH, UNSET_DIM
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.passes.base import Pass, PassResult, RepairContext
from paramsurgery.patterns.batch_heads import BATCH_T_AXIS, HeadsPlan, plan_heads


def apply_heads(g: Graph, plan: HeadsPlan, readers: list[tuple[Layer, int]] | None = None,
                name: str = "") -> str:
    """Rewrite `plan` in place; returns the [D, T, H] blob. A `direct` plan adds a Reshape out
    of n after `plan.blob` and points `readers` (default: every reader of it) at it."""
    for split in plan.unbatch:  # [R, T, H, 1] → [R, T, H]: pnnx's unit c dropped
        dims = reshape_dims(split) or []
        if isinstance(split.params.get(6), str):
            split.set(6, ",".join(dims[:3]))
        else:  # 0/1/11/2 = w, h, d, c: d becomes c
            split.set(2, split.params.get(11))
            split.set(11, UNSET_DIM)
    for cat, slot, width in plan.concats:
        src = cat.inputs[slot]
        base = f"{cat.name}_unbatch"
        g.insert_before(cat, "Reshape", g.unique_layer_name(base), _out_of_n(width, plan.heads),
                        slot=slot, new_blob=g.unique_blob_name(f"{src}_unbatch"))
        cat.set(0, 2)
    if not plan.direct:
        return plan.blob
    if readers is None:
        readers = [(x, s) for x, s in g.consumers(plan.blob)]
    out = g.unique_blob_name(f"{plan.blob}_unbatch")
    g.add_layer("Reshape", g.unique_layer_name(f"{name or plan.blob}_unbatch"), [plan.blob],
                [out], _out_of_n(plan.head_dim, plan.heads), after=g.producer(plan.blob))
    for layer, slot in readers:
        g.set_input(layer, slot, out)
    return out


def _out_of_n(width: int, heads: int) -> dict[int, object]:
    return {12: BATCH_T_AXIS, 13: NO_BATCH, 6: f"{width},0n,{heads}"}


# repair_order 12: after fold-gqa (which rewrites the k/v it folds itself), before causal-mask
class UnbatchHeads(Pass, name="unbatch-heads", tag="unbatchheads", repair_order=12,
                   summary="attention heads pnnx's dynamic export keeps in ncnn's batch axis "
                           "(fused QKV split into heads, partial rotary: RotaryEmbed on a 4-D "
                           "blob, Concat 0=3 of a batched part) → the [D, T, H] blobs SDPA and "
                           "RotaryEmbed take"):
    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "UnbatchHeads | None":
        return cls() if asked else None

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        plans: list[tuple[Layer, int, HeadsPlan]] = []
        for sdpa in g.by_type("SDPA"):
            mine: list[tuple[Layer, int, HeadsPlan]] = []
            try:  # all of an SDPA's heads or none (one slot left batched is still wrong)
                for slot in range(min(3, len(sdpa.inputs))):
                    plan = plan_heads(g, sdpa.inputs[slot], {sdpa.id})
                    if plan is not None and not any(p.blob == plan.blob for _, _, p in plans):
                        mine.append((sdpa, slot, plan))
            except MatchFailure as exc:
                why = f"{'qkv'[slot]}: {exc.reason}"
                result.skipped.append(MatchFailure(sdpa.name, why, line=sdpa.source_line))
                result.notes.append(f"{sdpa.name} left with its heads in ncnn's batch axis "
                                    f"(wrong in ncnn): {why}")
                continue
            plans += mine
        for sdpa, slot, plan in plans:
            readers = None
            if plan.direct:  # the copy this SDPA reads (other readers keep the batched head)
                plan.blob, readers = sdpa.inputs[slot], [(sdpa, slot)]
            before = plan.blob
            blob = apply_heads(g, plan, readers, f"{sdpa.name}_{'qkv'[slot]}")
            result.changes.append(Change(
                sdpa.name, f"{'qkv'[slot]}: {plan.heads} heads of {plan.head_dim} ({plan.form}) "
                           f"in ncnn's batch axis", before,
                f"{blob} [w={plan.head_dim}, h=T, c={plan.heads}]", sdpa.source_line))
        if plans:
            g.toposort()
            g.insert_splits()
            result.modified = True
        elif not result.skipped:
            result.notes.append("no SDPA reads heads in pnnx's batch form")
        return result
