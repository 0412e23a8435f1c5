"""Learned tables a static export folded at its traced length T0, for `dynamize` from one
trace (`dynamize_shapes.ShapeDynamize`): GPT-2's `wpe(arange(T))`, BERT's position and
token-type embeddings, Whisper's cropped `embed_positions`, ViT's (interpolated) position
embeddings. pnnx folds each into a `MemoryData` of T0 rows added (`BinaryOp`) to a blob
whose same axis is the length.

- **uniform** (every row the same: BERT's token types, all 0): the table becomes its one
  row, which `BinaryOp` broadcasts over any length: exact at every length.
- **learned** (rows differ): row p is read as the table's entry for position p (the only
  reading a model that adds `table[arange(T)]` has), cropped at run time to the length:
  nothing beyond the T0 traced rows exists in the file, so it is exact for lengths up to T0
  (`--pair` with a longer export takes its longer table) and proven numerically, through
  ncnn, at the reference's length against its torch outputs (`check_reference`); a
  reference longer than the table is refused naming `--pair`. A table that is not
  position-indexed (ViT's interpolated grid: its rows at another image size are other
  values) fails that check and is refused, naming it.
"""

from __future__ import annotations

import os
import tempfile
from typing import Sequence

import numpy as np

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer

# what lets a learned position table through at every length, upstream: pnnx folds
# `wpe(arange(T))` of a static trace into T rows; traced with a dynamic length it keeps the
# whole table (`nn.Embedding` of the positions: an ncnn Embed over an arange), e.g. the zoo's
# GPT-2 and BERT `inputshape2` exports
UPSTREAM = ("or export with pnnx inputshape2= (a second input shape: pnnx then keeps the "
            "whole table, an Embed of the positions, instead of folding the traced rows; "
            "pnnx's fold: paramsurgery repro issue folded-position-table)")
# a table whose rows are not a prefix of the paired one's (ViT's grid interpolated to the
# patch grid): no crop or pair extends it; pnnx's dynamic export keeps the Interp
UPSTREAM_INTERPOLATED = ("export with pnnx inputshape2= (a second input shape: pnnx then keeps "
                         "the learned grid and interpolates it at run time, an Interp sized "
                         "by the input, instead of folding the traced values; pnnx's fold: "
                         "paramsurgery repro issue folded-interpolated-table)")

def zero_masks(g: Graph, traced_len: int) -> list[tuple[Layer, list[Layer], list[Layer]]]:
    """Additive attention masks pnnx folded at the traced length that are all 0 (BERT's
    padding mask when nothing is padded): (the MemoryData, the SDPA layers reading it as
    their mask, the Splits between). softmax(s + 0) = softmax(s) at every length: the mask can go."""
    from paramsurgery.patterns.match import readers_through_splits

    out = []
    for m in g.by_type("MemoryData"):
        dims = [m.params.get(pid, 0) for pid in (0, 1, 11, 2)]
        if traced_len not in dims or len(m.outputs) != 1 or not m.weights or \
                not len(m.weights):
            continue
        readers, splits = readers_through_splits(g, m.outputs[0])
        if not readers or any(r.type != "SDPA" or slot != 3 or r.params.get(5, 0) != 1 or
                              r.params.get(7, 0) for r, slot in readers):
            continue
        if np.all(m.weights[0].array() == 0):
            out.append((m, [r for r, _ in readers], splits))
    return out


def drop_mask(g: Graph, mask: Layer, readers: list[Layer], splits: list[Layer]) -> None:
    """Each SDPA reads no mask (`5=0`, its fourth bottom gone); the MemoryData and its Splits
    go."""
    for r in readers:
        g.set_inputs(r, list(r.inputs[:3]))
        r.set(5, 0)
    g.remove_dead([mask, *splits])


def _left(g: Graph, traced_len: int) -> str:
    """The constants still holding the traced length in two dims or more (folded masks): the
    likely reason a rewritten graph fails at another length."""
    if not traced_len:
        return ""
    left = [m.name for m in g.by_type("MemoryData")
            if [m.params.get(pid, 0) for pid in (0, 1, 11, 2)].count(traced_len) >= 2]
    if not left:
        return ""
    return (f"; still sized by the trace ({traced_len}): MemoryData " + ", ".join(left[:3]) +
            " (a folded mask: make it an input, or give --pair OTHER.param)")


# readers that combine a table with a blob of the same layout, element by element
ELEMENTWISE = ("BinaryOp",)
REF_RTOL = 1e-4  # float32 through a tiny transformer: 1e-6..1e-5 measured


def uniform_rows(values: np.ndarray, axis: int) -> bool:
    """Every slice along `axis` equals the first."""
    first = np.take(values, [0], axis=axis)
    return bool(np.array_equal(np.broadcast_to(first, values.shape), values))


def shrink_to_row(layer: Layer, pid: int, values: np.ndarray, axis: int) -> None:
    """The table becomes its first row (the length dim 1), for BinaryOp to broadcast."""
    from paramsurgery.formats.weights import set_weights

    layer.set(pid, 1)
    row = np.ascontiguousarray(np.take(values, [0], axis=axis), dtype=np.float32)
    set_weights(layer, {"data": row.reshape(-1)})


def check_reference(g: Graph, reference: str, tables: Sequence[str], target_len: int | None,
                    traced_len: int) -> str:
    """Run the rewritten graph through ncnn on the reference's inputs: its outputs must match
    the reference's torch outputs (max|a-b| ≤ REF_RTOL·max|b| after size-1 axes are
    dropped); PassRefused naming the tables otherwise. Returns the figure for the report."""
    from paramsurgery.formats.io import save
    from paramsurgery.formats.pnnx_reference import REFERENCE_ERRORS, Reference
    from paramsurgery.runtime.child import Feed, Fetch, RunOptions, run_isolated

    names = ", ".join(tables)
    try:
        ref = Reference.load(reference, g)
    except REFERENCE_ERRORS as exc:
        raise PassRefused(f"{names}: a learned table cropped to the length must be checked "
                          f"against the reference, which cannot be read ({exc})") from exc
    with np.load(reference) as z:
        want = {blob: np.asarray(z[key]) for blob, key in ref.output_keys.items()}
    if not want:
        raise PassRefused(f"{names}: the reference {reference} has no outputs to check the "
                          f"learned table(s) against")
    if any(s.array is None for s in ref.inputs):
        raise PassRefused(f"{names}: the reference {reference} lacks an input array")
    feeds = {s.blob: Feed(np.asarray(s.array), 233 if s.batch_index is None else s.batch_index)
             for s in ref.inputs}
    fetch = [Fetch(b, ref.output_batch.get(b, 233)) for b in want]
    with tempfile.TemporaryDirectory(prefix="paramsurgery-table-") as tmp:
        param, binp = os.path.join(tmp, "t.param"), os.path.join(tmp, "t.bin")
        save(g, param, bin=binp)
        res = run_isolated(param, binp, feeds, fetch, RunOptions())
    at = f"T={target_len}" if target_len is not None else "the reference's length"
    if not res.ok:
        raise PassRefused(f"{names}: the graph with the learned table(s) cropped does not run "
                          f"at {at}: {res.describe()}{_left(g, traced_len)}")
    worst = 0.0
    for blob, w in want.items():
        got = np.asarray(res.outputs[blob], dtype=np.float64)
        w64 = w.astype(np.float64)
        if got.size != w64.size:
            raise PassRefused(f"{names}: at {at} output {blob!r} has {got.size} elements, the "
                              f"reference {w64.size}: not proven; give --pair OTHER.param")
        err = float(np.abs(got.reshape(-1) - w64.reshape(-1)).max())
        rel = err / max(float(np.abs(w64).max()), 1e-30)
        worst = max(worst, rel)
    if worst > REF_RTOL:
        trace = f" of the {traced_len}-long trace" if traced_len else " of the trace"
        raise PassRefused(f"{names}: with the table(s) cropped to the length the output differs "
                          f"from the reference at {at} (rel {worst:.2e}): a table shorter than "
                          f"that length, one not indexed by position (row p = position p), or "
                          f"another value{trace} left; give --pair OTHER.param (an export "
                          f"traced at that length or more), or make the table an input")
    return f"checked through ncnn against the reference at {at}: rel {worst:.1e}"
