"""Matching helpers: a match either succeeds with captures or fails with a reason, so every
pass can say which layers it took and, for near-misses, why not (`--explain`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..graph import Graph
from ..layer import Layer


@dataclass
class Match:
    layer: Layer
    ok: bool
    reason: str = ""
    captures: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.ok

    def __getitem__(self, key: str) -> Any:
        return self.captures[key]


def matched(layer: Layer, **captures: Any) -> Match:
    return Match(layer, True, "", captures)


def fail(layer: Layer, reason: str) -> Match:
    return Match(layer, False, reason)


class InputAncestry:
    """For every blob, the set of graph inputs (tops of `Input` layers) it depends on.
    Computed once, in file order (one pass, no recursion); blobs whose producer comes later
    than a reader are resolved by the same pass after `toposort`."""

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
