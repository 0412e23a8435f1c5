"""Attention heads pnnx's dynamic export keeps in ncnn's batch axis, proven from the layers
(shared by lint's PS010 and the `unbatch-heads` / `fold-gqa` rewrites).

Under a dynamic export (`inputshape2`) pnnx infers the sequence axis T as ncnn's batch `n`
once a fused projection is split into heads (Phi-3's and GPT-NeoX's fused QKV):

    Reshape 13=1 6="D,H,0h,1"        torch (1, T, H, D), T in n: ncnn [w=D, h=H, c=1] × n=T
    (HF's transpose(1, 2) is free: it only moves T's torch axis to 2)
    [Slice on w]                      the rotary part | the pass-through part of each head
    Reshape 12=2 13=233 6="R,0n,H,1"  T out of n: 4-D [w=R, h=T, d=H, c=1] (torch (1,H,T,R))
    RotaryEmbed                       on a 4-D blob it rotates the first head only (PS405)
    Concat 0=3 (rotated, pass part)   joins a 4-D blob with a batched 3-D one

The same 4-D RotaryEmbed input arises without the batch axis: a plain `Reshape
6="D,0h,H,1"` of 3-D heads (Qwen3's k after its per-head norm and transpose); that split is
written 3-D the same way.

`plan_heads` proves the rewrite to `[w=D, h=T, c=H]` (what SDPA and RotaryEmbed take) for
one blob an SDPA reads, or says why not.
"""


from __future__ import annotations

import re
from dataclasses import dataclass, field

from paramsurgery.analysis.shape_expr import int_or_none, reshape_dims
from paramsurgery.core.match import MatchFailure
from paramsurgery.core.ncnn import AUTO_SLICE, NO_BATCH
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.patterns.match import above_splits, readers_through_splits

# layers a head blob passes through unchanged in layout (RotaryEmbed: its data input)
_ALONG = ("Split", "RotaryEmbed", "RMSNorm", "LayerNorm")
_BLOB_REF = re.compile(r"(?<![\w.])(\d+)([whdcn])")  # `1h`: bottom 1's h in a Crop expression
BATCH_T_AXIS = 2  # torch axis of T in a batched head blob (1, H, T, D) after HF's transpose


@dataclass
class HeadsPlan:
    """How one blob's heads are rewritten to [D, T, H]: `blob` is the blob to read after
    the rewrite (3-D), `unbatch` the head splits out of n made 3-D, `concats` the
    partial-rotary joins (the Concat, its pass-through slot, that part's width), `direct`:
    a batched blob read as is (a Reshape out of n goes between it and its readers)."""

    blob: str
    head_dim: int
    heads: int
    unbatch: list[Layer] = field(default_factory=list)
    concats: list[tuple[Layer, int, int]] = field(default_factory=list)
    direct: bool = False
    form: str = ""


def _int(layer: Layer, pid: int, default: int) -> int:
    v = layer.params.get(pid, default)
    return v if isinstance(v, int) else default


def _slice_widths(layer: Layer, width: int) -> list[int] | None:
    """The widths of a Slice's outputs along w of a `width`-wide blob (ncnn's `-233`: the
    rest, split evenly), or None when it is not such a Slice."""
    sizes = layer.params.get(0)
    axis = _int(layer, 1, 0)
    if not isinstance(sizes, list) or axis not in (2, -1) or len(sizes) != len(layer.outputs):
        return None
    out: list[int] = []
    left = width
    for i, s in enumerate(sizes):
        s = int(s)
        if s == AUTO_SLICE:
            rest = len(sizes) - i
            if left % rest:
                return None
            s = left // rest
        if s <= 0:
            return None
        out.append(s)
        left -= s
    return out if left == 0 else None


def batched_heads(g: Graph, blob: str) -> tuple[int, int, list[Layer]] | None:
    """(width, heads, layers passed) when `blob` holds heads in ncnn's batch axis: a
    `Reshape 13=1 6="D,H,0h,1"` (T into n, [w=D, h=H, c=1]), or Slices along w of one,
    through Splits; None otherwise."""
    cur, _ = above_splits(g, blob)
    slices: list[tuple[Layer, int]] = []  # (Slice, output index), nearest first
    p = g.producer(cur)
    for _ in range(64):
        if p is None or p.type != "Slice" or len(p.inputs) != 1:
            break
        slices.append((p, p.outputs.index(cur)))
        cur, _ = above_splits(g, p.inputs[0])
        p = g.producer(cur)
    if p is None or p.type != "Reshape" or _int(p, 13, NO_BATCH) != 1:
        return None
    dims = reshape_dims(p)
    if not dims or len(dims) != 4 or dims[2] != "0h" or int_or_none(dims[3]) != 1:
        return None
    width, heads = int_or_none(dims[0]), int_or_none(dims[1])
    if width is None or heads is None or width <= 0 or heads <= 0:
        return None
    for sl, i in reversed(slices):
        widths = _slice_widths(sl, width)
        if widths is None:
            return None
        width = widths[i]
    return width, heads, [p, *(sl for sl, _ in slices)]


def _out_of_batch(layer: Layer) -> tuple[int, int] | None:
    """(width, heads) of `Reshape 12=2 13=233 6="R,0n,H,1"` (T out of n, 4-D), else None."""
    return _four_d_heads(layer, BATCH_T_AXIS, "0n")


def _unit_c(layer: Layer) -> tuple[int, int] | None:
    """(width, heads) of a plain `Reshape 6="D,0h,H,1"`: 3-D heads [D, T, H] written 4-D
    with a unit c (Qwen3's k after its per-head RMSNorm and transpose in a dynamic export).
    The elements are in the same order with or without the trailing 1, so dropping it is
    exact; RotaryEmbed and SDPA only read the 3-D form right."""
    return _four_d_heads(layer, NO_BATCH, "0h")


def _four_d_heads(layer: Layer, batch_axis: int, length: str) -> tuple[int, int] | None:
    """(R, H) of a `Reshape 6="R,<length>,H,1"` whose input batch axis (12) is
    `batch_axis` (NO_BATCH: none) and whose output has none (13), R and H positive numbers;
    else None."""
    if layer.type != "Reshape" or _int(layer, 12, NO_BATCH) != batch_axis or \
            _int(layer, 13, NO_BATCH) != NO_BATCH:
        return None
    dims = reshape_dims(layer)
    if not dims or len(dims) != 4 or dims[1] != length or int_or_none(dims[3]) != 1:
        return None
    r, h = int_or_none(dims[0]), int_or_none(dims[2])
    return (r, h) if r is not None and h is not None and r > 0 and h > 0 else None


def _four_d(g: Graph, blob: str) -> tuple[Layer, list[Layer]] | None:
    """The head split out of n above `blob` through Splits / RotaryEmbed (data) / norms, and
    the layers passed; None when there is none."""
    cur = blob
    passed: list[Layer] = []
    for _ in range(64):
        p = g.producer(cur)
        if p is None:
            return None
        if p.type in _ALONG and p.inputs:
            passed.append(p)
            cur = p.inputs[0]
            continue
        found = _out_of_batch(p) is not None or _unit_c(p) is not None
        return (p, passed) if found else None
    return None


def plan_heads(g: Graph, blob: str, allowed: set[int] | None = None, *,
               check_readers: bool = True) -> HeadsPlan | None:
    """The rewrite that makes `blob` (read by an SDPA, or the kv root fold-gqa folds) a
    [D, T, H] blob, or None when its heads are not in pnnx's batch form; MatchFailure when
    they are but the rewrite cannot be proven (the layer and why). `allowed`: layer ids
    that may read the changed blobs (the SDPA, the expansion fold-gqa removes);
    `check_readers=False`: only the layout (D, H), for a walk that checks its readers itself."""
    allowed = set(allowed or ())
    root, _ = above_splits(g, blob)
    p = g.producer(root)
    if p is None:
        return None
    # a batched head the reader takes as is (GPT-NeoX's v straight from the fused split)
    direct = batched_heads(g, root)
    if direct is not None:
        return HeadsPlan(root, direct[0], direct[1], direct=True, form="batched")
    if p.type == "Reshape" and _int(p, 12, NO_BATCH) == NO_BATCH and p.inputs:
        # the SDPA's view `6="D,0h,H"` of a 4-D [D, T, H, 1] (kept: the same on [D, T, H])
        root, _ = above_splits(g, p.inputs[0])
        p = g.producer(root)
        if p is None:
            return None
    changed: list[str] = []
    path: list[Layer] = []
    plan: HeadsPlan
    if p.type == "Concat" and len(p.inputs) == 2 and _int(p, 0, 0) in (3, -1):
        plan = _plan_concat(g, p, path, changed)
    else:
        found = _four_d(g, root)
        if found is None:
            return None
        split, passed = found
        unit = _unit_c(split)
        r, h = unit or _out_of_batch(split) or (0, 0)
        src = None if unit is not None else batched_heads(g, split.inputs[0])
        if unit is None and (src is None or src[:2] != (r, h)):
            raise MatchFailure(split, f"Reshape {split.name!r} takes T out of ncnn's batch "
                                      f"axis from a blob not proven [w={r}, h={h}] heads in n")
        plan = HeadsPlan(root, r, h, [split], form="4-D")
        path += [split, *passed]
        changed += [split.outputs[0]] + [x.outputs[0] for x in passed if x.type != "Split"]
    ids = {x.id for x in path} | allowed
    for b in changed if check_readers else ():
        for reader, slot in readers_through_splits(g, b)[0]:
            if reader.id in ids and not (reader.type == "RotaryEmbed" and slot != 0):
                continue
            if _reads_extent_only(reader, slot) or _keeps_heads(reader, plan):
                continue
            if reader.type == "SDPA" and slot in (0, 1, 2):
                continue
            raise MatchFailure(reader, f"{reader.type} {reader.name!r} also reads {b!r} (heads "
                                       f"in pnnx's 4-D/batch form): it would see [D, T, H] "
                                       f"after the rewrite")
    return plan


def _plan_concat(g: Graph, cat: Layer, path: list[Layer], changed: list[str]) -> HeadsPlan:
    """Phi-3 / GPT-NeoX partial rotary: `Concat 0=3` of the rotated part (a head split out
    of n, through RotaryEmbed) and the pass-through part (the other output of the same Slice,
    still in n), in this order or the other."""
    rot_slot = None
    found = None
    for slot, b in enumerate(cat.inputs):
        f = _four_d(g, b)
        if f is not None and any(x.type == "RotaryEmbed" for x in f[1]):
            rot_slot, found = slot, f
    if found is None or rot_slot is None:
        raise MatchFailure(cat, f"Concat {cat.name!r} joins no RotaryEmbed of a head split out "
                                f"of ncnn's batch axis (not a partial rotary)")
    split, passed = found
    r, h = _out_of_batch(split) or (0, 0)
    pass_slot = 1 - rot_slot
    rot_src, _ = above_splits(g, split.inputs[0])
    pass_src, _ = above_splits(g, cat.inputs[pass_slot])
    sl = g.producer(rot_src)
    rot = batched_heads(g, rot_src)
    kept = batched_heads(g, pass_src)
    if sl is None or sl.type != "Slice" or g.producer(pass_src) is not sl or \
            rot_src == pass_src or rot is None or kept is None:
        raise MatchFailure(cat, f"Concat {cat.name!r}: its parts are not two outputs of one "
                                f"Slice of a head split in ncnn's batch axis (the rotary and "
                                f"the pass-through part of each head)")
    if rot[:2] != (r, h) or kept[1] != h:
        raise MatchFailure(split, f"Reshape {split.name!r} ({r} wide, {h} heads) does not take "
                                  f"the rotary part [{rot[0]} wide, {rot[1]} heads] of "
                                  f"Slice {sl.name!r} out of ncnn's batch axis")
    first, second = (r, kept[0]) if rot_slot == 0 else (kept[0], r)
    if sl.outputs.index(rot_src) - sl.outputs.index(pass_src) != rot_slot - pass_slot:
        raise MatchFailure(cat, f"Concat {cat.name!r} joins the parts of Slice {sl.name!r} in "
                                f"the other order: not one head's elements put back")
    path += [split, *passed, cat]
    changed += [split.outputs[0]] + [x.outputs[0] for x in passed if x.type != "Split"] + \
        [cat.outputs[0]]
    return HeadsPlan(cat.outputs[0], first + second, h, [split], [(cat, pass_slot, kept[0])],
                     form="partial rotary")


def _reads_extent_only(reader: Layer, slot: int) -> bool:
    """HF's mask crop to the key length: a two-input Crop whose reference (bottom 1) it
    reads only the width/length of (the same in [D, T, H, 1] and [D, T, H])."""
    if reader.type != "Crop" or slot != 1 or len(reader.inputs) not in (2, 3):
        return False
    exprs = [str(reader.params.get(i, "")) for i in (19, 20, 21)]
    refs = [dim for e in exprs for blob, dim in _BLOB_REF.findall(e) if blob == "1"]
    return bool(exprs[0] and exprs[1]) and all(dim in "wh" for dim in refs)


def _keeps_heads(reader: Layer, plan: HeadsPlan) -> bool:
    """A `Reshape 6="D,0h,H"` (the SDPA's view of the heads): the same [D, T, H] from the
    4-D [D, T, H, 1] and from the 3-D blob."""
    if reader.type != "Reshape" or _int(reader, 12, NO_BATCH) != NO_BATCH or \
            _int(reader, 13, NO_BATCH) != NO_BATCH:
        return False
    dims = reshape_dims(reader)
    return dims is not None and len(dims) == 3 and dims[1] == "0h" and \
        int_or_none(dims[0]) == plan.head_dim and int_or_none(dims[2]) == plan.heads


