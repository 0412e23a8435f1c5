"""Top-to-bottom layered layout of a DAG, computed in Python (Sugiyama-style, every step
linear or n·log n in the drawing size, no recursion).

1. Ranks: longest path from the sources in the given node order (a `.param` lists layers
   topologically); sources with successors are then pulled down next to their first
   reader, so an `Input` read at layer 500 is not drawn at the top with a 500-rank edge.
   Edges that point backwards in the order (a cycle in a broken file) are drawn but do
   not constrain the ranks.
2. Edges spanning several ranks get one virtual point per rank crossed, so crossing
   reduction and routing see them. Edges longer than `max_span` ranks (the attention mask
   or the rope tables read by every block of a decoder) are not routed: they become
   jumps, drawn as two labelled stubs, which keeps the drawing linear in the graph size
   and the picture readable.
3. Crossings: barycenter sweeps down and up, keeping the order with fewest crossings
   between adjacent ranks.
4. x coordinates: each rank is placed as close as possible (least squares) to the mean x
   of its neighbours in the previous rank, keeping its order and the box gaps: an
   isotonic regression solved by pool-adjacent-violators, O(rank size). Sweeps down and up
   straighten chains.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Sequence

RANK_GAP = 46.0  # vertical space between the bottom of a rank and the top of the next
NODE_GAP = 22.0  # horizontal space between boxes of one rank
VIRTUAL_WIDTH = 8.0  # the width a virtual (edge) point takes in its rank
SWEEPS = 4
MAX_SPAN = 12  # longer edges are drawn as jumps


@dataclass
class Placed:
    """The drawing of a DAG: node centres, sizes, and each edge's polyline."""

    x: list[float]
    y: list[float]
    width: float
    height: float
    rank: list[int]
    routes: list[list[tuple[float, float]]] = field(default_factory=list)  # per input edge;
    # [] for a jump (an edge longer than max_span: drawn as two stubs, not routed)
    crossings: int = 0


def layered_layout(widths: Sequence[float], heights: Sequence[float],
                   edges: Sequence[tuple[int, int]], *, sweeps: int = SWEEPS,
                   max_span: int = MAX_SPAN) -> Placed:
    """Place nodes 0..n-1 (given in topological order where possible) and route `edges`
    (u, v): the route of edge i runs from u's bottom to v's top through the virtual points
    between them (end points included; the caller moves them to ports)."""
    n = len(widths)
    rank = _ranks(n, edges)
    # ---- virtual points: one per rank crossed by a long edge
    w: list[float] = list(widths)
    node_rank = list(rank)
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    chains: list[list[int]] = []
    for u, v in edges:
        if rank[v] - rank[u] > max_span:
            chains.append([])
            continue
        if rank[v] <= rank[u]:  # backward or same-rank edge: no virtual points
            chains.append([u, v])
            continue
        chain = [u]
        for r in range(rank[u] + 1, rank[v]):
            vid = len(w)
            w.append(VIRTUAL_WIDTH)
            node_rank.append(r)
            succ.append([])
            pred.append([])
            chain.append(vid)
        chain.append(v)
        for s, t in zip(chain, chain[1:]):
            succ[s].append(t)
            pred[t].append(s)
        chains.append(chain)
    total = len(w)
    n_ranks = (max(node_rank) + 1) if total else 0
    layers: list[list[int]] = [[] for _ in range(n_ranks)]
    for i in range(total):
        layers[node_rank[i]].append(i)
    # ---- crossing reduction
    pos = [0] * total
    for lay in layers:
        for i, v in enumerate(lay):
            pos[v] = i
    best = [list(lay) for lay in layers]
    best_cross = _crossings(layers, succ, pos)
    for _ in range(sweeps):
        for r in range(1, n_ranks):
            _sort_by_barycenter(layers[r], pred, pos)
        for r in range(n_ranks - 2, -1, -1):
            _sort_by_barycenter(layers[r], succ, pos)
        c = _crossings(layers, succ, pos)
        if c < best_cross:
            best_cross = c
            best = [list(lay) for lay in layers]
        if c == 0:
            break
    layers = best
    for lay in layers:
        for i, v in enumerate(lay):
            pos[v] = i
    # ---- coordinates
    row_h = [0.0] * n_ranks
    for i in range(n):
        row_h[node_rank[i]] = max(row_h[node_rank[i]], heights[i])
    row_y = [0.0] * n_ranks
    y_acc = RANK_GAP / 2
    for r in range(n_ranks):
        row_y[r] = y_acc + row_h[r] / 2
        y_acc += row_h[r] + RANK_GAP
    x = [0.0] * total
    for lay in layers:
        acc = 0.0
        for v in lay:
            x[v] = acc + w[v] / 2
            acc += w[v] + NODE_GAP
    for _ in range(2):
        for r in range(1, n_ranks):
            _align(layers[r], pred, x, w)
        for r in range(n_ranks - 2, -1, -1):
            _align(layers[r], succ, x, w)
    for r in range(1, n_ranks):
        _align(layers[r], pred, x, w)
    left = min((x[v] - w[v] / 2 for v in range(total)), default=0.0)
    shift = NODE_GAP - left
    x = [xi + shift for xi in x]
    width = max((x[v] + w[v] / 2 for v in range(total)), default=0.0) + NODE_GAP
    y = [row_y[node_rank[v]] for v in range(total)]
    routes = [[(x[p], y[p]) for p in chain] for chain in chains]
    return Placed(x=x[:n], y=y[:n], width=width, height=y_acc - RANK_GAP / 2, rank=rank,
                  routes=routes, crossings=best_cross)


def _ranks(n: int, edges: Sequence[tuple[int, int]]) -> list[int]:
    """Longest path from the sources along forward edges; sources pulled down to just above
    their first reader."""
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        if u < v:
            preds[v].append(u)
            succs[u].append(v)
    rank = [0] * n
    for v in range(n):
        p = preds[v]
        if p:
            rank[v] = max(rank[u] for u in p) + 1
    for v in range(n - 1, -1, -1):
        if not preds[v] and succs[v]:
            rank[v] = max(0, min(rank[s] for s in succs[v]) - 1)
    return rank


def _sort_by_barycenter(lay: list[int], nbrs: list[list[int]], pos: list[int]) -> None:
    keys = {}
    for v in lay:
        nb = nbrs[v]
        keys[v] = sum(pos[u] for u in nb) / len(nb) if nb else float(pos[v])
    lay.sort(key=keys.__getitem__)
    for i, v in enumerate(lay):
        pos[v] = i


def _crossings(layers: list[list[int]], succ: list[list[int]], pos: list[int]) -> int:
    """Edge crossings between adjacent ranks (inversions counted with a sorted insert:
    n log n in practice for the few edges between two ranks)."""
    total = 0
    for lay in layers[:-1]:
        ends: list[tuple[int, int]] = []
        for v in lay:
            for t in succ[v]:
                ends.append((pos[v], pos[t]))
        ends.sort()
        seen: list[int] = []
        for _, b in ends:
            i = bisect_left(seen, b + 1)
            total += len(seen) - i
            seen.insert(i, b)
    return total


def _align(lay: list[int], nbrs: list[list[int]], x: list[float], w: list[float]) -> None:
    """Move the rank's nodes toward the mean x of their neighbours, in order, gaps kept:
    minimise sum (x_i - d_i)^2 subject to x_{i+1} - x_i >= gap_i (pool adjacent violators
    on x_i - offset_i)."""
    if not lay:
        return
    offsets = [0.0] * len(lay)
    acc = 0.0
    for i in range(1, len(lay)):
        acc += (w[lay[i - 1]] + w[lay[i]]) / 2 + NODE_GAP
        offsets[i] = acc
    # blocks of (sum, count); the solution is each block's mean
    sums: list[float] = []
    counts: list[int] = []
    for i, v in enumerate(lay):
        nb = nbrs[v]
        d = sum(x[u] for u in nb) / len(nb) if nb else x[v]
        sums.append(d - offsets[i])
        counts.append(1)
        while len(sums) > 1 and sums[-2] / counts[-2] > sums[-1] / counts[-1]:
            s, c = sums.pop(), counts.pop()
            sums[-1] += s
            counts[-1] += c
    i = 0
    for s, c in zip(sums, counts):
        m = s / c
        for _ in range(c):
            x[lay[i]] = m + offsets[i]
            i += 1
