"""Fold grouped-query K/V expansion into SDPA (`paramsurgery fold-gqa`).

Decoders with grouped-query attention (G kv heads, H = G*rep query heads) are often
exported with K and V repeated from G to H heads before attention, although ncnn's SDPA
does GQA natively (`H % G == 0`; query head j reads kv head j // (H/G), src/layer/sdpa.cpp).
The pass removes the expansion and feeds SDPA the kv-head K/V:

    k [D, T, G] -> ExpandDims(1) -> Tile [1,rep,1,1] -> Reshape [D, T, H] -> SDPA k
    ==>
    k [D, T, G] -> SDPA k                                   (same for v)

Expansion forms recognised (ncnn axes outermost-first, K/V as `[w=D, h=T, c=G]`):

- `ExpandDims -23303=1,1` + `Tile -23302=4,1,rep,1,1` (or `0=1 1=rep`) + `Reshape` to
  `[D, T, H]`: ncnn's benchmark LLM params, and pnnx's conversion of
  `k[:, :, None].expand(-1, -1, rep, -1, -1).reshape(...)` / `unsqueeze(2).repeat(...)`;
- `ExpandDims` + `Tensor.expand` (sizes from a `pnnx.Expression`) + `Reshape`: the unloadable
  leftovers of HF's `repeat_kv` under a dynamic export (pnnx-bugs case 1);
- `Concat 0=1` of rep copies + `Reshape [D, T, rep, G]` + `Reshape [D, T, H]`: pnnx's
  conversion of `torch.stack([k] * rep, 2).reshape(...)`.

Under a dynamic export the kv heads may be in pnnx's batch-axis form (T in ncnn's batch:
the repeat_kv on k after a 4-D RotaryEmbed, Phi-3's partial-rotary Concat, a batched v behind
pnnx's batch-to-dim `Tensor.reshape`); the fold then writes them as [D, T, G] with
`unbatch-heads`' proven rewrite (`patterns/batch_heads.py`).

Each is the repeat_interleave order (head j = kv head j // rep), which is what SDPA's GQA
computes; the pass proves it from the graph: the new axis sits right after the head axis,
only it is repeated, and the final Reshape keeps `w = D` and `h = T` (so it merges exactly
(G, rep) into H). D and G are read from the head-splitting `Reshape` above K/V (through
`Split`, `RotaryEmbed`, `RMSNorm`/`LayerNorm`, `Permute 0=2`). Repeat orders that would
pair query head j with kv head j mod G (`cat([k]*rep, dim=1)`) are refused.

Other readers of an expanded K/V must only need its width/length: a two-input `Crop`
whose expressions reference the reference blob's `w`/`h` (HF's mask slice
`mask[..., :k_len]`) is rewired to the kv-head K; anything else makes the pass leave that
SDPA alone, with the reason. Works before and after `add-kvcache` (K/V are SDPA bottoms 1
and 2 either way); after it the cache holds G heads instead of H (G/H of the bytes).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult, RepairContext, check_selection
from paramsurgery.passes.options import internal, option
from paramsurgery.core.match import MatchFailure
from paramsurgery.passes.unbatch_heads import apply_heads
from paramsurgery.patterns.batch_heads import HeadsPlan, plan_heads
from paramsurgery.patterns.match import above_splits, readers_through_splits
from paramsurgery.patterns.splits import resplit
from paramsurgery.analysis.shape_expr import int_or_none, reshape_dims
from paramsurgery.analysis.shapes import infer_shapes

if TYPE_CHECKING:
    from paramsurgery.analysis.shapes import ShapeMap
    from paramsurgery.formats.pnnx_param import PnnxGraph

PASS_THROUGH_LAYOUT = ("Split", "RotaryEmbed", "RMSNorm", "LayerNorm")


@dataclass
class KVExpansion:
    """One matched expansion on SDPA bottom `slot` (1 = k, 2 = v)."""

    sdpa: Layer
    slot: int
    form: str  # "tile" | "expand" | "stack"
    root: str  # the kv-head blob (above any Split)
    expanded: str  # the blob holding H heads
    layers: list[Layer] = field(default_factory=list)  # the expansion, to delete
    readers: list[tuple[Layer, int]] = field(default_factory=list)  # readers of `expanded`
    head_dim: int = 0
    kv_heads: int = 0
    heads: int = 0  # H = kv_heads * rep
    # the kv heads are in pnnx's batch-axis form (dynamic export): rewritten to [D, T, G]
    # with the expansion removed (patterns/batch_heads.py)
    heads_plan: HeadsPlan | None = None


NOT_EXPANDED = "not-expanded"  # MatchFailure.kind: SDPA reads k/v as they come (maybe kv heads)


def _named(layer: Layer | None) -> str:
    return f"{layer.type} {layer.name!r}" if layer is not None else "nothing"


def _expand_dims_of(g: Graph, blob: str, axis: int, at: Layer | None, tensor: str,
                    adding: str, *, only_reader: bool = False) -> Layer:
    """The ExpandDims adding torch's `axis` that writes `blob` (and, `only_reader`, is its
    only reader's input); else MatchFailure at `at`: "`tensor` comes from <the producer>,
    not from ExpandDims adding `adding`"."""
    exp = g.producer(blob)
    if exp is None or exp.type != "ExpandDims" or _ints(exp.params.get(3)) != [axis] or \
            (only_reader and len(g.consumers(blob)) != 1):
        raise MatchFailure(at, f"{tensor} comes from {_named(exp)}, not from ExpandDims "
                               f"adding {adding}")
    return exp


def _ints(v) -> list[int] | None:
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return [int(v)]


def kv_layout(g: Graph, blob: str, shapes: "ShapeMap | None" = None) -> tuple[int, int]:
    """(head_dim, kv_heads) of a K/V blob `[w=D, h=T, c=G]`: from the shape analysis when it
    knows the blob's D and G (e.g. an Input given by `--inputshape`), else read from the
    Reshape that split the heads, walking up through Split / RotaryEmbed (data input) /
    RMSNorm / LayerNorm / Permute 0=2. Raises MatchFailure with the reason."""
    known = shapes.shape_of(blob) if shapes is not None else None
    if known is not None and len(known) == 3 and isinstance(known[0], int) and \
            isinstance(known[2], int):
        return known[2], known[0]
    heads_plan = plan_heads(g, blob, check_readers=False)
    if heads_plan is not None:  # heads in pnnx's batch-axis form (dynamic export)
        return heads_plan.head_dim, heads_plan.heads
    cur, swapped, passed = blob, False, []
    for _ in range(64):
        p = g.producer(cur)
        if p is None:
            raise MatchFailure(None, f"cannot find how {blob!r} was split into heads (no producer of "
                                f"{cur!r})")
        if p.type in PASS_THROUGH_LAYOUT and p.inputs:
            passed.append(p.type)
            cur = p.inputs[0]
            continue
        if p.type == "Permute":
            order = p.params.get(0, 0)
            if order == 0:
                cur = p.inputs[0]
                continue
            if order == 2:  # 3-D (c,h,w) -> (h,c,w): w kept, h and c swapped
                swapped = not swapped
                cur = p.inputs[0]
                continue
            raise MatchFailure(p, f"Permute {p.name!r} (0={order}) above {blob!r} moves the head_dim "
                             f"axis")
        if p.type == "Reshape":
            dims = reshape_dims(p)
            if dims and len(dims) == 4 and int_or_none(dims[3]) == 1 and not swapped and \
                    not passed.count("Permute"):
                # [D, T, G, 1]: pnnx's batch axis kept as ncnn's c (dynamic export, k side)
                d, heads = int_or_none(dims[0]), int_or_none(dims[2])
                if d is None or heads is None or d <= 0 or heads <= 0:
                    raise MatchFailure(p, f"Reshape {p.name!r} above {blob!r} ({','.join(dims)}) "
                                          f"does not give head_dim and head count as numbers")
                return d, heads
            if not dims or len(dims) != 3:
                raise MatchFailure(p, f"Reshape {p.name!r} above {blob!r} is not a 3-D head split "
                                 f"({dims})")
            w, h, c = dims
            d = int_or_none(w)
            heads = int_or_none(h) if swapped else int_or_none(c)
            if d is None or heads is None or d <= 0 or heads <= 0:
                raise MatchFailure(p, f"Reshape {p.name!r} above {blob!r} ({','.join(dims)}) does not "
                                 f"give head_dim and head count as numbers")
            return d, heads
        hint = ""
        if p.type == "Input":
            hint = f"; its shape is not known: give --inputshape {cur}=[G,T,D]"
        raise MatchFailure(p, f"cannot find how {blob!r} was split into heads: {p.type} {p.name!r} "
                         f"is in the way{hint}")
    raise MatchFailure(None, f"cannot find how {blob!r} was split into heads (path too long)")


_BLOB_REF = re.compile(r"(?<![\w.])(\d+)([whdcn])")


class _Matcher:
    """One run's matching state: the shapes computed once for `kv_layout` and pnnx's IR
    (for the `Tensor.*` leftovers, whose shapes pnnx keeps only there)."""

    def __init__(self, shapes: "ShapeMap | None", pnnx: "PnnxGraph | None") -> None:
        self.shapes = shapes
        self.pnnx = pnnx
        self.traced = pnnx.path if pnnx is not None and pnnx.path else "X.pnnx.param"

    def _traced(self, at: Layer) -> "PnnxGraph":
        """pnnx's IR, or MatchFailure naming the flag."""
        if self.pnnx is None:
            raise MatchFailure(at, f"{at.type} {at.name!r} keeps its shape only in pnnx's "
                                   f"X.pnnx.param: give --pnnx (or keep it next to the input)")
        return self.pnnx

    # ------------------------------------------------------------------ matching
    def match(self, g: Graph, sdpa: Layer, slot: int) -> KVExpansion:
        side = "k" if slot == 1 else "v"
        blob = sdpa.inputs[slot]
        expanded, _ = above_splits(g, blob)
        r2 = g.producer(expanded)
        if r2 is not None and r2.type == "Tensor.reshape":
            return self._match_batch_expand(g, sdpa, slot, expanded, r2)
        if r2 is None or r2.type != "Reshape":
            raise MatchFailure(r2, f"{side} ({blob!r}) is not expanded: it does not come from a "
                              f"Reshape of repeated heads", kind=NOT_EXPANDED)
        src = g.producer(r2.inputs[0])
        layers: list[Layer] = [r2]
        rep: int | None
        if src is not None and src.type == "Tile":
            tile = src
            reps = _ints(tile.params.get(2))
            if reps is not None:
                if len(reps) != 4 or reps[0] != 1 or reps[2] != 1 or reps[3] != 1 or reps[1] < 1:
                    raise MatchFailure(tile, f"Tile {tile.name!r} repeats {reps}: want [1, rep, 1, 1] "
                                        f"(only the new axis after the heads)")
                rep = reps[1]
            else:
                if tile.params.get(0, 0) != 1:
                    raise MatchFailure(tile, f"Tile {tile.name!r} tiles axis {tile.params.get(0, 0)}, "
                                        f"not the new axis 1")
                rep = tile.params.get_int(1, 1)
            into = tile.inputs[0]
            form = "tile"
            layers.append(tile)
        elif src is not None and src.type == "Tensor.expand" and len(src.inputs) == 2:
            into = src.inputs[0]
            sizes = g.producer(src.inputs[1])
            layers.append(src)
            if sizes is not None and sizes.type == "pnnx.Expression" and \
                    g.consumer_layers(src.inputs[1]) == [src]:
                layers.append(sizes)
            rep = None
            form = "expand"
        elif src is not None and src.type == "Reshape":
            return self._match_stack(g, sdpa, slot, blob, expanded, r2, src)
        else:
            raise MatchFailure(r2, f"{side}: Reshape {r2.name!r} reshapes {_named(src)}, not a "
                                   f"Tile / Tensor.expand / stack of repeated heads")
        exp = _expand_dims_of(g, into, 1, None, f"{side}: the repeated tensor",
                              "axis 1 right after the heads (-23303=1,1)")
        layers.append(exp)
        root, splits = above_splits(g, exp.inputs[0])
        d, groups = kv_layout(g, root, self.shapes)
        heads = self._check_merge(r2, d, groups, rep, side)
        return self._finish(g, sdpa, slot, form, root, expanded, layers, d, groups, heads)

    def _match_stack(self, g: Graph, sdpa: Layer, slot: int, blob: str, expanded: str,
                     r2: Layer, r1: Layer) -> KVExpansion:
        side = "k" if slot == 1 else "v"
        cat = g.producer(r1.inputs[0])
        if cat is None or cat.type != "Concat":
            raise MatchFailure(r2, f"{side}: Reshape {r2.name!r} reshapes Reshape {r1.name!r}, which "
                              f"does not reshape a Concat of copies")
        sources = {above_splits(g, b)[0] for b in cat.inputs}
        if len(sources) != 1:
            raise MatchFailure(cat, f"{side}: Concat {cat.name!r} joins different tensors, not copies")
        axis = cat.params.get(0, 0)
        if axis not in (1, -2):
            raise MatchFailure(cat, f"{side}: Concat {cat.name!r} repeats along axis {axis}: query head j "
                               f"would read kv head j mod G (repeat order), not j // rep as SDPA's "
                               f"GQA does")
        rep = len(cat.inputs)
        root = sources.pop()
        d, groups = kv_layout(g, root, self.shapes)
        dims = reshape_dims(r1)
        if not dims or len(dims) != 4 or dims[0] not in (str(d), "0w") or \
                int_or_none(dims[2]) != rep or int_or_none(dims[3]) != groups:
            raise MatchFailure(r1, f"{side}: Reshape {r1.name!r} ({dims}) does not split the copies into "
                              f"[D={d}, T, rep={rep}, G={groups}]")
        heads = self._check_merge(r2, d, groups, rep, side)
        return self._finish(g, sdpa, slot, "stack", root, expanded, [r2, r1, cat], d, groups,
                            heads)

    def _match_batch_expand(self, g: Graph, sdpa: Layer, slot: int, expanded: str,
                            r2: Layer) -> KVExpansion:
        """HF's repeat_kv where pnnx kept the batch axis (dynamic export, k after RoPE):
        `ExpandDims 2` + `Tensor.expand` + `Tensor.reshape (1, H, -1, D)` on a
        [D, T, G, 1] blob. The order is proven from pnnx's traced shapes: the expand grows
        only the new unit axis 2 (right after the G heads) to rep = H / G, and the reshape
        merges (G, rep) into H keeping T and D — repeat_interleave, SDPA's GQA order."""
        side = "k" if slot == 1 else "v"
        pnnx = self._traced(r2)
        op_r = pnnx.op_by_name(r2.name)
        shape = op_r.ints("shape") if op_r is not None and op_r.type == r2.type else None
        if shape is None or len(shape) != 4 or shape[0] != 1 or shape[2] != -1 or \
                shape[1] <= 0 or shape[3] <= 0:
            raise MatchFailure(r2, f"{side}: Tensor.reshape {r2.name!r} reshapes to {shape} in "
                                   f"{self.traced}, not (1, H, -1, D)")
        heads, d = shape[1], shape[3]
        src = g.producer(r2.inputs[0]) if len(r2.inputs) == 1 else None
        if src is None or src.type != "Tensor.expand" or len(src.inputs) != 2 or \
                len(g.consumers(r2.inputs[0])) != 1:
            raise MatchFailure(r2, f"{side}: Tensor.reshape {r2.name!r} does not reshape only a "
                                   f"Tensor.expand")
        op_e = pnnx.op_by_name(src.name)
        ins = op_e.in_shape if op_e is not None and op_e.type == src.type else None
        outs = op_e.out_shape if op_e is not None and op_e.type == src.type else None
        if ins is None or outs is None or len(ins) != 5 or len(outs) != 5 or ins[0] != 1 or \
                ins[2] != 1 or outs[:2] != ins[:2] or outs[3:] != ins[3:] or ins[4] != d or \
                not isinstance(ins[1], int) or not isinstance(outs[2], int) or \
                ins[1] * outs[2] != heads:
            raise MatchFailure(src, f"{side}: Tensor.expand {src.name!r} goes {ins} -> {outs} in "
                                    f"{self.traced}: not (1, G, 1, T, D) -> (1, G, rep, T, D) "
                                    f"with G * rep = {heads}")
        groups = ins[1]
        layers: list[Layer] = [r2, src]
        sizes = g.producer(src.inputs[1])
        if sizes is not None and sizes.type == "pnnx.Expression" and \
                g.consumer_layers(src.inputs[1]) == [src]:
            layers.append(sizes)
        into = src.inputs[0]
        b2d = g.producer(into)
        if b2d is not None and b2d.type == "Tensor.reshape" and len(b2d.inputs) == 1 and \
                pnnx.op_by_name(b2d.name) is None and len(g.consumers(into)) == 1:
            # pnnx's own batch-to-dim step (`*_ncnnbatch2dim_*`, not in its IR): the expand's
            # input is the unsqueezed v still in ncnn's batch axis; removed with the expansion
            layers.append(b2d)
            into = b2d.inputs[0]
        exp = _expand_dims_of(g, into, 2, src, f"{side}: the expanded tensor",
                              "torch's axis 2 (-23303=1,2)", only_reader=True)
        layers.append(exp)
        root, _ = above_splits(g, exp.inputs[0])
        dk, gk = kv_layout(g, root, self.shapes)
        if (dk, gk) != (d, groups):
            raise MatchFailure(exp, f"{side}: {root!r} is split into {gk} heads of {dk}, pnnx's "
                                    f"trace has {groups} of {d}")
        e = self._finish(g, sdpa, slot, "expand", root, expanded, layers, d, groups, heads)
        e.heads_plan = plan_heads(g, root, {sdpa.id} | {x.id for x in e.layers})
        return e

    def _check_merge(self, r2: Layer, d: int, groups: int, rep: int | None, side: str) -> int:
        """The final Reshape must map [D, T, rep, G] to [D, T, G*rep]; returns H."""
        dims = reshape_dims(r2)
        if not dims or len(dims) != 3:
            raise MatchFailure(r2, f"{side}: Reshape {r2.name!r} ({dims}) is not 3-D [D, T, H]")
        w, h, c = dims
        if w not in (str(d), "0", "0w"):
            raise MatchFailure(r2, f"{side}: Reshape {r2.name!r} gives width {w}, not head_dim {d}")
        keeps_t = h in ("0", "0h")
        cn = int_or_none(c)
        if rep is not None:
            heads = groups * rep
            ok = (cn == heads and (keeps_t or h == "-1" or int_or_none(h) is not None)) or \
                 (c == "-1" and keeps_t)
        else:  # rep unknown (Tensor.expand): h must keep T, then c = G*rep by conservation
            ok = keeps_t and cn is not None and cn % groups == 0
            heads = cn if ok and cn is not None else 0
        if not ok:
            raise MatchFailure(r2, f"{side}: Reshape {r2.name!r} ({','.join(dims)}) is not provably "
                              f"[D={d}, T, H=G*rep] (G={groups}" +
                              (f", rep={rep})" if rep is not None else ", rep unknown)"))
        return heads

    def _finish(self, g: Graph, sdpa: Layer, slot: int, form: str, root: str, expanded: str,
                layers: list[Layer], d: int, groups: int, heads: int) -> KVExpansion:
        side = "k" if slot == 1 else "v"
        readers, splits = readers_through_splits(g, expanded)
        for layer, s in readers:
            if layer.type == "SDPA" and s in (1, 2):
                continue
            if layer.type == "Crop" and s == 1 and len(layer.inputs) in (2, 3):
                # (3: add-kvcache's widened mask crop, its third bottom the k cache)
                exprs = [str(layer.params.get(i, "")) for i in (19, 20, 21)]
                refs = {(m.group(1), m.group(2)) for e in exprs for m in _BLOB_REF.finditer(e)}
                if exprs[0] and exprs[1] and all(dim in "wh" for blob_i, dim in refs
                                                 if blob_i == "1"):
                    continue
                raise MatchFailure(layer, f"{side}: the expanded blob is the reference of Crop "
                                     f"{layer.name!r}, which uses more than its width/length")
            raise MatchFailure(layer, f"{side}: the expanded blob {expanded!r} is also read by {layer.type} "
                                 f"{layer.name!r}, which would see {groups} heads instead of {heads}")
        return KVExpansion(sdpa, slot, form, root, expanded, layers + splits, readers, d,
                           groups, heads)

# repair_order 10: the repeat_kv leftovers go before lower sees them
class FoldGQA(Pass, name="fold-gqa", repair_order=10,
              summary="remove the K/V head expansion (ExpandDims+Tile+Reshape, repeat_kv leftovers, stack) "
                      "before SDPA: SDPA does grouped-query attention natively"):
    only: frozenset[str] = option(default=frozenset(), many=True, metavar="NAME",
                                  help="only these SDPA layers")
    skip: frozenset[str] = option(default=frozenset(), many=True, metavar="NAME",
                                  help="leave these SDPA layers alone")
    # the shapes of graph inputs (`--inputshape`): kv_layout reads D and G from them
    inputshape: "Mapping[str, tuple] | None" = internal(default=None)
    # pnnx's IR (`formats.pnnx_param.read_pnnx_param`, read by the command or `fix`): the
    # traced shapes of the repeat_kv leftovers of a dynamic export
    traced: "PnnxGraph | None" = internal(default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "only", frozenset(self.only or ()))
        object.__setattr__(self, "skip", frozenset(self.skip or ()))
        object.__setattr__(self, "inputshape", dict(self.inputshape or {}))
        if isinstance(self.traced, (str, os.PathLike)):
            raise TypeError("fold-gqa: give pnnx's IR (formats.pnnx_param.read_pnnx_param(path)), "
                            "not a path: a pass reads no file")

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "FoldGQA | None":
        return cls(traced=ctx.pnnx) if asked else None  # the run's one parsed IR

    # ------------------------------------------------------------------ run
    def run(self, g: Graph) -> PassResult:
        sdpas = g.by_type("SDPA")
        check_selection(sdpas, self.only | self.skip, "SDPA")
        result = PassResult(g, False)
        m = _Matcher(infer_shapes(g, inputshape=self.inputshape), self.traced)  # once per run
        todo: list[tuple[Layer, KVExpansion, KVExpansion]] = []
        already = 0
        for sdpa in sdpas:
            if self.only and sdpa.name not in self.only:
                result.skipped.append(MatchFailure(sdpa.name, "not selected by --only",
                                                   line=sdpa.source_line))
                continue
            if sdpa.name in self.skip:
                result.skipped.append(MatchFailure(sdpa.name, "excluded by --skip", line=sdpa.source_line))
                continue
            if len(sdpa.inputs) < 3:
                result.skipped.append(MatchFailure(sdpa.name, f"has {len(sdpa.inputs)} bottoms (q k v "
                                                      f"needed)", line=sdpa.source_line))
                continue
            try:
                k = m.match(g, sdpa, 1)
                v = m.match(g, sdpa, 2)
            except MatchFailure as exc:
                reason = exc.reason
                if exc.kind == NOT_EXPANDED and self._both_plain(g, sdpa):
                    already += 1
                    reason = "k and v are not expanded (SDPA already reads kv heads)"
                result.skipped.append(MatchFailure(sdpa.name, reason, line=sdpa.source_line))
                continue
            if (k.kv_heads, k.heads) != (v.kv_heads, v.heads):
                result.skipped.append(MatchFailure(sdpa.name, f"k is {k.kv_heads}->{k.heads} heads but v "
                                                      f"{v.kv_heads}->{v.heads}", line=sdpa.source_line))
                continue
            todo.append((sdpa, k, v))
        if not todo:
            considered = [s for s in result.skipped
                          if not s.reason.startswith(("not selected", "excluded"))]
            if considered and already == len(considered):
                result.notes.append("every SDPA already reads kv heads")
            self._report_unloadable(g, result)
            return result
        for sdpa, k, v in todo:
            self._fold(g, k)
            self._fold(g, v)
            cache = " (its kv cache now holds kv heads)" if sdpa.params.get(7, 0) == 1 else ""
            result.changes.append(Change(
                sdpa.name, f"k/v {k.form} expansion removed: {k.heads} -> {k.kv_heads} kv heads "
                           f"(head_dim {k.head_dim}, rep {k.heads // max(k.kv_heads, 1)})"
                           f"{cache}", None, None, sdpa.source_line))
        result.modified = True
        result.data["folded"] = [{"sdpa": s.name, "heads": k.heads, "kv_heads": k.kv_heads,
                                  "head_dim": k.head_dim, "form": k.form, "k": k.root,
                                  "v": v.root, "kv_cache": s.params.get(7, 0) == 1}
                                 for s, k, v in todo]
        self._report_unloadable(g, result)
        return result

    def _both_plain(self, g: Graph, sdpa: Layer) -> bool:
        for slot in (1, 2):
            blob, _ = above_splits(g, sdpa.inputs[slot])
            p = g.producer(blob)
            if p is not None and p.type == "Reshape":
                src = g.producer(p.inputs[0])
                if src is not None and src.type in ("Tile", "Tensor.expand", "Reshape"):
                    return False
        return True

    def _report_unloadable(self, g: Graph, result: PassResult) -> None:
        from paramsurgery.core.layer_types import is_ncnn_layer

        left: dict[str, int] = {}
        for layer in g:
            if not is_ncnn_layer(layer.type):
                left[layer.type] = left.get(layer.type, 0) + 1
        if left:
            what = ", ".join(f"{t} x{n}" for t, n in sorted(left.items()))
            # an SDPA left alone for a reason may leave its own expansion among them
            why = next((s for s in result.skipped if not s.reason.startswith(
                ("not selected", "excluded", "k and v are not expanded"))), None)
            if why is not None:
                result.notes.append(f"fold-gqa cannot fold {why.layer}: {why.reason}")
            result.notes.append(f"the graph still has layers ncnn cannot load: {what} "
                                f"(fold-gqa leaves them{'' if why is None else ' or left the SDPA'})")
        result.data["unloadable"] = left

    def _fold(self, g: Graph, e: KVExpansion) -> None:
        for layer, slot in e.readers:
            g.set_input(layer, slot, e.root)
        g.remove_dead([x for x in e.layers if x.graph is g])
        if e.heads_plan is not None:  # [D, T, G] out of pnnx's batch-axis form
            out = apply_heads(g, e.heads_plan, e.readers, f"{e.sdpa.name}_{'kv'[e.slot - 1]}")
            if out != e.root:
                resplit(g, [out])
        resplit(g, [e.root])


def expand_gqa(g: Graph, form: str = "tile") -> list[str]:
    """The inverse of fold-gqa, in place: before every GQA SDPA (kv heads G < query heads
    H), expand K and V to H heads the way ncnn's benchmark LLM params do
    (`ExpandDims -23303=1,1` + `Tile -23302=4,1,rep,1,1` + `Reshape 0=D 1=-1 2=H`). Used to
    build the unfolded twin of a graph (benchmarks, tests). Returns the SDPA names."""
    if form != "tile":
        raise ValueError("only the tile form is built")
    done = []
    for sdpa in g.by_type("SDPA"):
        if len(sdpa.inputs) < 3:
            continue
        try:
            d, heads = kv_layout(g, sdpa.inputs[0])
            dk, groups = kv_layout(g, sdpa.inputs[1])
            dv, groups_v = kv_layout(g, sdpa.inputs[2])
        except MatchFailure:
            continue
        if groups != groups_v or heads == groups or heads % groups:
            continue
        rep = heads // groups
        for slot, side, dim in ((1, "k", dk), (2, "v", dv)):
            base = f"{sdpa.name}_{side}"
            for typ, suffix, params in (("ExpandDims", "unsqueeze", {3: [1]}),
                                        ("Tile", "expand", {2: [1, rep, 1, 1]}),
                                        ("Reshape", "reshape", {0: dim, 1: -1, 2: heads})):
                g.insert_before(sdpa, typ, g.unique_layer_name(f"{base}_{suffix}"), params,
                                slot=slot, new_blob=g.unique_blob_name(f"{base}_{suffix}"))
        done.append(sdpa.name)
    return done

