"""The one subgraph cut: the layers some layers depend on (their cone), found with
networkx's `ancestors` on the graph's view (`Graph.nx`), restricted to a set of layers
and/or stopped at cut blobs. `extract` cuts with it (stop at the given inputs) and `reduce`
shrinks with it (stay within the candidate layers)."""

from __future__ import annotations

from typing import Collection, Iterable

import networkx as nx

from .graph import Graph


def cone(g: Graph, sinks: Iterable[int], *, within: Collection[int] | None = None,
         stop: Collection[str] = ()) -> set[int]:
    """Ids of the layers `sinks` (layer ids) depend on, the sinks included: ancestors in
    `g.nx`, not leaving the layers `within` (all when None) nor crossing an edge that
    carries a blob in `stop`."""
    sinks = set(sinks)
    view: nx.MultiDiGraph = g.nx
    if within is not None:
        allowed = set(within) | sinks
        view = nx.subgraph_view(view, filter_node=allowed.__contains__)
    if stop:
        succ = g.nx._succ  # the edge data: producer -> consumer -> slot -> {"blob": ...}
        view = nx.subgraph_view(view, filter_edge=lambda u, v, k: succ[u][v][k]["blob"]
                                not in stop)
    found: set[int] = set()
    for s in sinks:
        if s not in found:  # else an ancestor of an earlier sink: its cone is in already
            found |= nx.ancestors(view, s)
    return found | sinks
