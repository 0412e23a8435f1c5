"""The one subgraph cut: the layers some layers depend on (their cone), found by networkx's
breadth-first search up `Graph.nx` (`generic_bfs_edges` with a neighbour rule), kept within
a set of layers and/or stopped at cut blobs, one search per sink not already reached.
`extract` cuts with it (stop at the given inputs) and `reduce` shrinks with it (stay within
the candidate layers)."""

from __future__ import annotations

from typing import Collection, Iterable

import networkx as nx

from paramsurgery.ir.graph import Graph


def cone(g: Graph, sinks: Iterable[int], *, within: Collection[int] | None = None,
         stop: Collection[str] = ()) -> set[int]:
    """Ids of the layers `sinks` (layer ids) depend on, the sinks included: their ancestors
    in `g.nx`, not leaving the layers `within` (all when None) nor crossing an edge that
    carries a blob in `stop`."""
    sinks = set(sinks)
    G = g.nx
    pred = G._pred  # consumer -> producer -> consumer slot -> {"blob": ...}
    allowed = None if within is None else set(within) | sinks
    found: set[int] = set()

    def up(v: int) -> list[int]:
        """The producers `v` reads from inside the cut that no earlier sink's search reached
        (so the sinks' searches share their work: each layer is expanded once in all; a view
        would filter every edge through wrappers, ~2.5x slower)."""
        return [u for u, reads in pred[v].items()
                if u not in found and (allowed is None or u in allowed)
                and (not stop or any(r["blob"] not in stop for r in reads.values()))]

    for s in sinks:
        if s not in found:  # else an ancestor of an earlier sink: its cone is in already
            found.update(v for _, v in nx.generic_bfs_edges(G, s, neighbors=up))
    return found | sinks
