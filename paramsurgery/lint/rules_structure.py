"""PS1xx: graph structure. PS101-PS110 are `validate(g)`'s checks
(paramsurgery/validate.py), run once per lint and split by code here so each has its own
`--explain` text and can be selected or ignored; PS111 is lint's own."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterator

from paramsurgery.analysis import validate as V
from paramsurgery.analysis.contracts import ATTENTION_TYPES, cache_tops
from paramsurgery.core.findings import Finding
from paramsurgery.lint.registry import ERROR, INFO, WARNING, Hit, rule

if TYPE_CHECKING:
    from paramsurgery.lint.context import LintContext


def _from_validate(code: str):
    def check(ctx: "LintContext") -> Iterator[Finding]:
        for f in ctx.validate_findings:
            if f.code == code:
                yield f
    return check


def _register(code: str, name: str, severity: str, summary: str, doc: str,
              fix: str | None = None, also: tuple[str, ...] = ()) -> None:
    fn = _from_validate(code)
    fn.__doc__ = doc
    rule(code, name, severity, summary, fix=fix, also=also)(fn)


_register(V.HEADER_LAYERS, "header-layer-count", ERROR,
          "header layer count disagrees with the body", """
    Line 2 of a `.param` declares the layer count. More lines than declared: ncnn silently
    ignores the extra layers (warning); `fmt` keeps them out of ncnn's reach (they may not
    load), so raise the count by hand if they are meant to run. Fewer: ncnn fails with
    "parse layer_type failed" (error); `paramsurgery fmt` recomputes the header.""",
          "paramsurgery fmt", also=(WARNING,))
_register(V.HEADER_BLOBS, "header-blob-count", ERROR,
          "header blob count smaller than the blobs the layers use", """
    ncnn sizes its blob table from the header (`blobs.resize(blob_count)`); using more
    blobs than declared is out of bounds (the wheel reports "too many blobs"). Declaring
    more than used is harmless. `paramsurgery fmt` recomputes the header.""",
          "paramsurgery fmt")
_register(V.DUPLICATE_TOP, "duplicate-blob", ERROR, "a blob name written by two layers", """
    Every top allocates a new blob; two layers writing the same name make two blobs with
    one name and `find_blob_index_by_name` returns the first, so readers of the second
    writer's data silently get the first's (or the wheel reports "too many blobs").
    Rename one of the tops.""")
_register(V.DANGLING_BOTTOM, "dangling-bottom", ERROR, "a layer reads a blob nobody writes", """
    A bottom whose name no layer produces becomes a blob with producer -1: ncnn loads the
    graph, then logs "invalid layer index -1" and crashes at extraction.""")
_register(V.ORDER, "out-of-order", ERROR, "a layer reads a blob before its producer", """
    ncnn requires layers in topological order (each bottom produced on an earlier line);
    a reader before its producer creates a second blob of that name and extraction hits
    producer -1. `Graph.toposort()` reorders, keeping the order wherever it is already
    valid.""", "Graph.toposort()")
_register(V.FANOUT_WITHOUT_SPLIT, "fanout-without-split", ERROR,
          "a blob read by several layers without a Split", """
    ncnn's default light mode frees a blob after its (recorded) consumer reads it; a second
    reader finds it empty, re-runs the producer chain recursively and, in the wheel,
    segfaults. pnnx inserts `Split splitncnn_N` for every multi-reader blob;
    `Graph.insert_splits()` does the same.""", "Graph.insert_splits()")
_register(V.TRIVIAL_SPLIT, "trivial-split", INFO, "a Split with a single top", """
    Harmless: a Split with one top copies a reference. `Graph.remove_trivial_splits()`
    removes it.""", "Graph.remove_trivial_splits()")
_register(V.INPUT_WITH_BOTTOMS, "input-with-bottoms", ERROR, "an Input layer with bottoms", """
    `Input` is a source: ncnn never feeds its bottoms, and the blob it would read stays
    unconnected.""")
_register(V.EMPTY_GRAPH, "empty-graph", ERROR, "a graph with no layers", """
    ncnn rejects `layer_count <= 0` ("invalid layer_count or blob_count").""")
_register(V.IGNORED_LINES, "ignored-lines", WARNING,
          "unparsable lines after the declared layers", """
    ncnn reads exactly the declared number of layers and ignores whatever follows; text
    after them is usually a truncated edit or a second graph pasted in.""")
_register(V.LAYER_ARITY, "layer-arity", ERROR,
          "a layer's bottom/top counts disagree with what its params make it read and write",
          """
    Some params fix how many blobs a layer's forward reads and writes, and ncnn's
    load_param does not check them: SDPA reads `q k v`, plus the mask with `5=1`, plus
    `past_k past_v` with `7=1` (then it writes `out k v`); MultiHeadAttention reads `q [k
    [v]]` plus the same extras; BinaryOp reads one bottom with `1=1` (with_scalar), else
    two; Gemm reads A unless `4=1`, B unless `5=1`, and an optional C unless `6=1`; MatMul,
    GridSample and CopyTo read 2, RotaryEmbed 3. A layer with other counts loads, then its
    forward reads past its vector of bottoms (a crash at extract) or takes one blob for
    another. The usual cause is a param edited by hand or through the Python API
    (`layer.set(7, 1)` on an SDPA without cache blobs); `paramsurgery set-param` refuses
    the same edit, `paramsurgery add-kvcache` sets 7=1 together with the cache blobs.""")
_register(V.PARAM_CONSISTENCY, "param-consistency", ERROR,
          "params of one layer that contradict each other", """
    Params ncnn's load_param accepts one by one but the forward cannot use together: a
    Reshape with `-1` in more than one of w/h/d/c (ncnn divides the element count by the
    other -1 and computes a negative size), a Crop whose starts (`9`) or ends (`10`) array
    is shorter than its axes (`11`), or, without axes, starts and ends of different
    lengths (ncnn reads past the end of the shorter array).""")


_PNNX_OUT = re.compile(r"out[0-9]+$")


@rule("PS111", "unused-blob", WARNING, "a blob written but never read that is not an output",
      also=(INFO,))
def unused_blob(ctx: "LintContext") -> Iterator[Hit]:
    """ncnn treats every blob with a producer and no reader as a graph output. Reported:

    - an `Input` top nobody reads (warning): the input is listed as an output and feeding
      it does nothing; usually the branch that used it was cut;
    - in a graph that names its outputs `out0`, `out1`, … (pnnx's convention), any other
      unread blob of a layer with no read top at all (warning): a dead branch that still
      costs run time when extracted, and that pnnx itself may crash on (case 6d);
    - an unread top of a multi-output layer whose other tops are read (info): e.g. a Slice
      part the model discards.

    Not reported: the cache tops of an SDPA / MultiHeadAttention with ncnn's native kv cache
    (`7=1`, tops `out k v`): the host extracts them and feeds them back as the next step's
    past."""
    g = ctx.graph
    cons = g._consumers
    # the unread tops of each layer, from the blob index (no walk over the layers)
    unread_of: dict[int, dict[int, str]] = {}
    for b, prods in g._producers.items():
        if not cons.get(b):
            for lid, slot in prods:
                unread_of.setdefault(lid, {})[slot] = b
    # the cache tops of a native kv cache (SDPA/MHA 7=1) are outputs the host reads back
    expected = {b for lay in g.by_type(*ATTENTION_TYPES) for b in cache_tops(lay)}
    if expected:
        for lid in list(unread_of):
            tops = {slot: b for slot, b in unread_of[lid].items() if b not in expected}
            if tops:
                unread_of[lid] = tops
            else:
                del unread_of[lid]
    pnnx_style = any(_PNNX_OUT.match(b) for tops in unread_of.values() for b in tops.values())
    for lid in sorted(unread_of, key=g._key.__getitem__):
        layer = g.layer(lid)
        outs = layer.outputs
        unread = [unread_of[lid][slot] for slot in sorted(unread_of[lid])]
        if layer.type == "Input":
            for b in unread:
                yield Hit(layer, f"graph input {b!r} is never read: ncnn lists it as an output "
                                 f"and feeding it does nothing")
            continue
        if len(unread) < len(outs):
            names = ", ".join(repr(b) for b in unread)
            yield Hit(layer, f"{layer.type} {layer.name!r} top(s) {names} are never read (ncnn "
                             f"lists them as outputs)", severity=INFO)
            continue
        if pnnx_style and not any(_PNNX_OUT.match(b) for b in unread):
            yield Hit(layer, f"{layer.type} {layer.name!r} writes {unread[0]!r}, which nothing "
                             f"reads and is not a pnnx output (out0, out1, …): a dead branch")
