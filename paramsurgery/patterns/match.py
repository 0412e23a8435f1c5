"""Matching helpers: a match either succeeds with captures or fails with a reason, so every
pass can say which layers it took and, for near-misses, why not (`--explain`).

Two forms of the same thing: `Match`/`fail(layer, reason)` for a matcher that returns, and
`MatchFailure(layer, reason)` for one that raises from deep inside a walk. The shared walks below
raise `MatchFailure`, so every pass words a broken chain the same way:

- `above_splits(g, blob)` / `source_of(g, blob)`: up through `Split` copies;
- `readers_through_splits(g, blob)` / `through_splits(g, blob)`: down through `Split` copies;
- `single_reader(g, blob)`: the one layer reading a blob;
- `chain_up(g, blob, through, until)`: up through 1→1 layers of given types to a layer of
  another type (an Embed under layout layers, a Reshape under Permutes, ...);
- `walk_up(g, blobs, through)`: every blob above `blobs` through layers of given types,
  each once, with its producer; `readers_below(read, blobs, through)`: the other way, the
  layers reading what comes down through such layers; `visit_once(start, expand)` is the
  depth-first worklist under both, for walks over anything hashable.

Walks are loops over the graph's producer/consumer indices (no recursion, no rescans).
"""

from __future__ import annotations

from typing import Callable, Collection, Hashable, Iterable, Iterator, Sequence, TypeVar

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.match import MatchFailure


def above_splits(g: Graph, blob: str) -> tuple[str, list[Layer]]:
    """The blob `blob` is a `Split` copy of (itself when it is not one) and the Splits
    passed, nearest first."""
    splits: list[Layer] = []
    p = g.producer(blob)
    while p is not None and p.type == "Split" and len(p.inputs) == 1 and p not in splits:
        splits.append(p)
        blob = p.inputs[0]
        p = g.producer(blob)
    return blob, splits


def source_of(g: Graph, blob: str) -> Layer | None:
    """The producer of `blob`, looking back through `Split` copies."""
    return g.producer(above_splits(g, blob)[0])


def readers_through_splits(g: Graph, blob: str) -> tuple[list[tuple[Layer, int]], list[Layer]]:
    """The non-Split readers of `blob` through Split trees (layer, bottom slot) and the
    Splits passed."""
    splits: list[Layer] = []
    out = [(layer, slot) for layer, _, slot in _walk_down(g, blob, splits)]
    return out, splits


def _reads(g: Graph, blob: str) -> list[tuple[Layer, str]]:
    return [(layer, b) for layer, b, _ in _walk_down(g, blob, [])]


H = TypeVar("H", bound=Hashable)


def visit_once(start: Iterable[H], expand: Callable[[H], Iterable[H]],
               seen: set[H] | None = None) -> Iterator[H]:
    """Depth-first over `start` and what `expand` returns, each item once (a worklist, no
    recursion). `expand(x)` runs after `x` is yielded, so the caller may stop early; a
    `seen` set shared between walks visits each item once over all of them."""
    stack = list(start)
    seen = set() if seen is None else seen
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        yield x
        stack.extend(expand(x))


def walk_up(g: Graph, blobs: Iterable[str], through: Collection[str],
            seen: set[str] | None = None) -> Iterator[tuple[str, Layer | None]]:
    """Every blob at or above `blobs`, once (`seen`: as in `visit_once`), with its producer
    (None: dangling), going up through the inputs of producers whose type is in `through`."""
    def up(b: str) -> list[str]:
        p = g.producer(b)
        return list(p.inputs) if p is not None and p.type in through else []

    for b in visit_once(blobs, up, seen):
        yield b, g.producer(b)


def readers_below(read: Callable[[str], Iterable[Layer]], blobs: Iterable[str],
                  through: Collection[str]) -> Iterator[Layer]:
    """Every layer `read(blob)` gives for a blob at or below `blobs` whose type is not in
    `through`, going down through the outputs of those whose type is (each blob once; a
    layer once per blob it reads). `read`: a graph's `consumer_layers`, or a reader that
    looks through Split copies."""
    def down(b: str) -> list[str]:
        return [o for c in read(b) if c.type in through for o in c.outputs]

    for b in visit_once(blobs, down):
        yield from (c for c in read(b) if c.type not in through)


def _walk_down(g: Graph, blob: str, splits: list[Layer]) -> list[tuple[Layer, str, int]]:
    """(reader, the copy of `blob` it reads, bottom slot) for every non-Split read below
    `blob`; the Splits passed are appended to `splits`."""
    out: list[tuple[Layer, str, int]] = []

    def down(b: str) -> list[str]:
        copies: list[str] = []
        for layer, slot in g.consumers(b):
            if layer.type == "Split":
                splits.append(layer)
                copies.extend(layer.outputs)
            else:
                out.append((layer, b, slot))
        return copies

    for _ in visit_once([blob], down):
        pass
    return out


def through_splits(g: Graph, blob: str) -> list[Layer]:
    """The layers reading `blob`, looking through `Split` copies (each layer once per
    blob it reads)."""
    return list({(id(layer), b): layer for layer, b in _reads(g, blob)}.values())


def single_reader(g: Graph, blob: str) -> Layer:
    """The only layer reading `blob`; MatchFailure naming the others when there are several."""
    found = g.consumer_layers(blob)
    if len(found) == 1:
        return found[0]
    prod = g.producer(blob)
    if not found:
        raise MatchFailure(prod, f"nothing reads {blob!r}")
    names = ", ".join(f"{c.type} {c.name!r}" for c in found)
    raise MatchFailure(prod, f"{blob!r} is read by {len(found)} layers ({names})")


def chain_up(g: Graph, blob: str, through: Sequence[str], until: Sequence[str], *,
             reader: Layer | None = None, what: str = "blob", goal: str | None = None,
             limit: int = 64) -> tuple[Layer, list[Layer]]:
    """Walk up from `blob` through 1→1 layers whose type is in `through` to the first
    layer whose type is in `until`: that layer and the layers passed, nearest first.
    With `reader`, every blob on the way must be read only by the layer below it (`reader`
    for `blob` itself): a chain shared with other readers cannot be rewritten. Raises
    MatchFailure naming the layer where the walk stopped (`what` names `blob`, `goal` the
    target, in its words)."""
    goal = goal or " / ".join(until)
    chain: list[Layer] = []
    cur = blob
    for _ in range(limit):
        p = g.producer(cur)
        if p is None:
            raise MatchFailure(None, f"{what} {cur!r} has no producer")
        if reader is not None:
            below = chain[-1] if chain else reader
            found = g.consumer_layers(cur)
            if found != [below]:
                others = ", ".join(repr(r.name) for r in found if r is not below)
                raise MatchFailure(p, f"blob {cur!r} ({p.type} {p.name!r}) is also read by "
                                 f"{others}; the rewrite would remove it")
        if p.type in until:
            return p, chain
        if p.type in through and len(p.inputs) == 1 and len(p.outputs) == 1:
            chain.append(p)
            cur = p.inputs[0]
            continue
        raise MatchFailure(p, f"{what} {blob!r} comes from {p.type} {p.name!r}, not from {goal} "
                         f"through layers ({', '.join(through)})")
    raise MatchFailure(g.producer(cur), f"{what} {blob!r}: more than {limit} layers above it "
                                   f"before {goal}")


class InputAncestry:
    """For every blob, the set of graph inputs (tops of `Input` layers) it depends on.
    Computed once, in file order (one pass, no recursion): a blob read before the line that
    writes it (a file out of topological order) is seen as depending on no input."""

    def __init__(self, g: Graph) -> None:
        self._of: dict[str, frozenset[str]] = {}
        for layer in g:
            if layer.type == "Input":
                for b in layer.outputs:
                    self._of[b] = frozenset((b,))
                continue
            deps: frozenset[str] = frozenset()
            for b in layer.inputs:
                deps = deps | self._of.get(b, frozenset())
            for b in layer.outputs:
                self._of[b] = deps

    def __call__(self, blob: str) -> frozenset[str]:
        return self._of.get(blob, frozenset())
