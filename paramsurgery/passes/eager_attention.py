"""Eager attention whose mask is applied with `torch.where` → one SDPA (`lower` runs it
before its rules).

GPT-2's eager attention (transformers `eager_attention_forward`) is

    s = q·kᵀ / √D;  s = where(bias[.., Tk-Tq:Tk, :Tk], s, finfo.min);  s = s + mask
    softmax(s) · v

and pnnx fuses the plain MatMul → scale → add → Softmax → MatMul chain into an SDPA but
stops at the `where`: ncnn has no `torch.where`, and the masks reach BinaryOps, which
neither the causal-mask rebuild nor add-kvcache read. This rewrite recognises the chain
(each link read only by the next) on 4-D `(1, H, T, ·)` or 3-D `(H, T, ·)` blobs of known
head count and head size (the shape analysis), and writes ncnn's SDPA:

    q, v:  Reshape 0=D 1=-1 2=H                     (H, Tq, D) / (H, Tk, D)
    kᵀ:    Reshape 0=-1 1=D 2=H → Permute 0=1       (H, Tk, D)
    SDPA 6=scale [5=1 with the additive mask]  →  Reshape back to the scores' rank

with the length as -1, so the shape analysis and dynamize follow it. The `where` goes
only where it is proven to mask nothing the additive mask does not: its condition is a
constant that is 1 on and below the diagonal and 0 above (the causal `bias` window at the
traced length, bool or fix-bool-table's 0/1), its other value is ≤ -1e4, and the additive
mask is a constant proven causal of the same side (causal_mask.causal_value) — then both
mask exactly the entries j > i and the softmax of `c + mask` and of `s + mask` there is 0
either way (a causal row always keeps its diagonal). With no additive mask, the condition
itself becomes one (a MemoryData of c above the diagonal, 0 elsewhere: a causal constant
the rebuild takes from the lengths). Anything else (a condition computed in the graph, a
mask read by other layers, another chain) is left as it is, with the reason.
"""

from __future__ import annotations

import numpy as np

from paramsurgery.core.changes import Change
from paramsurgery.core.match import MatchFailure
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.passes.causal_mask import MASK_FLOOR, causal_value, memory_shape


def _only_reader(g: Graph, blob: str) -> Layer | None:
    readers = g.consumers(blob)
    return readers[0][0] if len(readers) == 1 else None


def _constant(g: Graph, blob: str) -> Layer | None:
    prod = g.producer(g.above_splits(blob))
    return prod if prod is not None and prod.type == "MemoryData" else None


def _values(layer: Layer) -> np.ndarray | None:
    if not layer.weights or not len(layer.weights):
        return None
    return np.asarray(layer.weights[0].array(), dtype=np.float64).reshape(memory_shape(layer))


class _Chain:
    """One matched eager attention: its layers and what the SDPA needs."""

    def __init__(self, mm1: Layer) -> None:
        self.mm1 = mm1
        self.scale = 1.0
        self.scale_layer: Layer | None = None
        self.where: Layer | None = None
        self.add: Layer | None = None
        self.softmax: Layer | None = None
        self.mm2: Layer | None = None
        self.mask: str | None = None  # the additive mask blob the SDPA reads


def _match(g: Graph, mm1: Layer) -> _Chain:
    """The chain from the scores MatMul `mm1`, or MatchFailure naming the layer and why."""
    c = _Chain(mm1)
    if len(mm1.inputs) != 2 or mm1.params.get(0, 0):
        raise MatchFailure(mm1, "not a plain two-input MatMul (q·kᵀ)")
    cur = mm1.outputs[0]
    layer = _only_reader(g, cur)
    if layer is not None and layer.type == "BinaryOp" and layer.params.get(1, 0) == 1 and \
            layer.params.get(0, 0) in (2, 3):
        s = float(layer.params.get(2, 1.0))  # type: ignore[arg-type]
        if s == 0:
            raise MatchFailure(layer, "scales the scores by 0")
        c.scale = s if layer.params.get(0, 0) == 2 else 1.0 / s
        c.scale_layer = layer
        cur = layer.outputs[0]
        layer = _only_reader(g, cur)
    for _ in range(2):
        if layer is None:
            break
        if layer.type == "torch.where" and c.where is None and len(layer.inputs) == 3 and \
                layer.inputs[1] == cur:
            c.where = layer
        elif layer.type == "BinaryOp" and c.add is None and layer.params.get(0, 0) == 0 and \
                not layer.params.get(1, 0) and len(layer.inputs) == 2 and \
                layer.inputs[0] == cur:
            c.add, c.mask = layer, layer.inputs[1]
        else:
            break
        cur = layer.outputs[0]
        layer = _only_reader(g, cur)
    if c.where is None:
        raise MatchFailure(mm1, "no torch.where between the scores and the softmax (pnnx fuses "
                                "the chain without one itself)")
    if layer is None or layer.type != "Softmax":
        raise MatchFailure(mm1, "the masked scores do not reach one Softmax")
    c.softmax = layer
    mm2 = _only_reader(g, layer.outputs[0])
    if mm2 is None or mm2.type != "MatMul" or mm2.inputs[0] != layer.outputs[0] or \
            mm2.params.get(0, 0):
        raise MatchFailure(layer, "the softmax is not multiplied by v in one MatMul")
    c.mm2 = mm2
    return c


def _prove_masks(g: Graph, c: _Chain, side: int) -> tuple[float, bool]:
    """(the where's fill value c, whether the additive mask makes the where redundant); the
    where's condition must be the causal keep window of `side`."""
    where = c.where
    assert where is not None
    cond, other = _constant(g, where.inputs[0]), _constant(g, where.inputs[2])
    if cond is None:
        raise MatchFailure(where, "its condition is computed in the graph, not a constant "
                                  "proven causal")
    m = _values(cond)
    if m is None:
        raise MatchFailure(cond, f"the values of MemoryData {cond.name!r} are needed: give --bin")
    if m.ndim < 2 or m.shape[-1] != m.shape[-2] or m.shape[-1] != side or \
            any(d != 1 for d in m.shape[:-2]):
        raise MatchFailure(cond, f"its shape {m.shape} is not one ({side}, {side}) window")
    keep = np.tril(np.ones((side, side)))
    if not np.array_equal((m.reshape(side, side) != 0).astype(float), keep):
        raise MatchFailure(cond, "not 1 on and below the diagonal and 0 above (a causal window)")
    v = _values(other) if other is not None else None
    if v is None or v.size != 1 or not float(v.reshape(-1)[0]) <= MASK_FLOOR:
        raise MatchFailure(where, "its other value is not one constant <= -1e4 (a masking value)")
    fill = float(v.reshape(-1)[0])
    if c.mask is None:
        return fill, False
    add_const = _constant(g, c.mask)
    a = _values(add_const) if add_const is not None else None
    if a is None:
        raise MatchFailure(c.add, "the mask it adds is not a constant (with its values) proven "
                                  "causal: the where cannot be folded into it")
    val, why = causal_value(a)
    if val is None or a.shape[-1] != side:
        raise MatchFailure(add_const, f"the added mask is not causal of side {side}: {why}")
    return fill, True


def _dims(shape: tuple | None) -> tuple[int, int] | None:
    """(H, last) of a (1, H, T, x) or (H, T, x) blob with static H and last dim."""
    if shape is None or len(shape) not in (3, 4) or (len(shape) == 4 and shape[0] != 1):
        return None
    h, last = shape[-3], shape[-1]
    return (h, last) if isinstance(h, int) and isinstance(last, int) else None


def fuse_eager_attention(g: Graph, shapes: object) -> tuple[list[Change], list[MatchFailure]]:
    """Fuse every matched chain; (changes, why each candidate was left)."""
    changes: list[Change] = []
    left: list[MatchFailure] = []
    todo: list[tuple] = []  # matched and proven first: the rewrites change blob names
    for mm1 in list(g.by_type("MatMul")):
        if mm1.graph is not g:
            continue
        try:
            c = _match(g, mm1)
        except MatchFailure as exc:
            if "no torch.where" not in exc.reason:
                left.append(exc)
            continue
        q4, kt4 = mm1.inputs
        assert c.mm2 is not None and c.softmax is not None and c.where is not None
        v4 = c.mm2.inputs[1]
        known = shapes.known  # type: ignore[attr-defined]
        qd, kd, vd, sd = (_dims(known(b)) for b in (q4, kt4, v4, mm1.outputs[0]))
        rank = len(known(mm1.outputs[0]) or ())
        if qd is None or kd is None or vd is None or sd is None or qd[0] != kd[0] or \
                qd[0] != vd[0] or kd[1] != known(v4)[-2] or qd[1] != known(kt4)[-2]:
            left.append(MatchFailure(mm1, "q, kᵀ, v are not (1, H, T, D) / (1, H, D, T) blobs of "
                                          "known heads and head size"))
            continue
        heads, dim = qd
        side = known(mm1.outputs[0])[-1]
        sm_axis = c.softmax.params.get(0, 0)
        if sm_axis not in (-1, rank - 1) or not isinstance(side, int):
            left.append(MatchFailure(c.softmax, "the softmax is not over the keys (last axis)"))
            continue
        try:
            fill, redundant = _prove_masks(g, c, side)
        except MatchFailure as exc:
            left.append(exc)
            continue
        todo.append((c, heads, dim, vd[1], rank, fill, redundant))
    for args in todo:
        changes.append(_rewrite(g, *args))
    if todo:
        g.toposort()
        g.insert_splits()
    return changes, left


def _rewrite(g: Graph, c: _Chain, heads: int, dim: int, vdim: int, rank: int, fill: float,
             redundant: bool) -> Change:
    mm1, mm2, where = c.mm1, c.mm2, c.where
    assert mm2 is not None and where is not None
    name, line = mm1.name, mm1.source_line
    q4, kt4 = mm1.inputs
    v4, top = mm2.inputs[1], mm2.outputs[0]

    def add(type_: str, suffix: str, ins: list[str], params: dict) -> str:
        blob = g.unique_blob_name(f"{name}_{suffix}")
        g.add_layer(type_, g.unique_layer_name(f"{name}_{suffix}"), ins, [blob], params,
                    before=mm2)
        return blob

    q = add("Reshape", "q", [q4], {0: dim, 1: -1, 2: heads})
    kt = add("Reshape", "kt", [kt4], {0: -1, 1: dim, 2: heads})
    k = add("Permute", "k", [kt], {0: 1})
    v = add("Reshape", "v", [v4], {0: vdim, 1: -1, 2: heads})
    mask = c.mask
    how = "the where's causal window is the added causal mask's (dropped)"
    if mask is None:  # the where's window as an additive causal constant
        cond = _constant(g, where.inputs[0])
        assert cond is not None
        side = memory_shape(cond)[-1]
        table = np.triu(np.full((side, side), fill, dtype=np.float32), 1)
        mask = g.unique_blob_name(f"{name}_causal_mask")
        layer = g.add_layer("MemoryData", g.unique_layer_name(f"{name}_causal_mask"), [], [mask],
                            {0: side, 1: side}, before=mm2)
        from paramsurgery.formats.weights import set_weights

        set_weights(layer, {"data": table.reshape(-1)})
        how = f"the where's causal window as an additive mask ({fill:g} above the diagonal)"
    ins = [q, k, v] + ([mask] if mask is not None else [])
    params: dict = {5: 1, 6: float(c.scale)} if mask is not None else {6: float(c.scale)}
    out = add("SDPA", "sdpa", ins, params)
    dead = [x for x in (c.softmax, c.add, where, c.scale_layer, mm1) if x is not None]
    if rank == 4:
        g.replace_layer(mm2, "Reshape", mm2.name, inputs=[out], outputs=[top],
                        params={0: vdim, 1: -1, 11: heads, 2: 1})
    else:
        g.replace_uses(top, out)
        dead.insert(0, mm2)
    g.remove_dead(dead)
    before = f"MatMul {name} → scale → torch.where {where.name} → " + \
        (f"add {c.add.name} → " if c.add is not None else "") + "Softmax → MatMul"
    assert redundant or c.mask is None
    return Change(name, f"eager attention with a torch.where mask → SDPA ({how})", before,
                  f"SDPA {name}_sdpa 6={c.scale:g} over {heads} heads of {dim}", line)
