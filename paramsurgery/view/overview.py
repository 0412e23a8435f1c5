"""The overview of a graph made of repeated blocks (a decoder's 28 transformer blocks): the
layers before and after the blocks drawn as they are, the blocks as one group box
("28 × block") that a click expands into the full drawing.

Finding the blocks, linear in the graph size: each layer gets a signature (type, bottom
and top counts); a signature that recurs at a steady distance gives a candidate period p
(the most common gap between its occurrences); the longest stretch of the file where the
signature sequence repeats itself every p layers (sig[i] == sig[i + p]) is the run of
blocks, cut into blocks of p layers from its end (the last block ends where the layers
after the blocks begin). The block before the run is then looked for as a subsequence:
block 0 of a decoder shares its stretch of the file with the mask and rope tables.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paramsurgery.view.labels import clip, wrap
from paramsurgery.view.scene import MISSING, OUTPUT, Box, Scene, Wire, add_layer

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph

MIN_REPEATS = 3  # fewer repeats than this are drawn as they are
MIN_LAYERS = 100  # smaller graphs are readable whole
MIN_COVER = 0.5  # the blocks must be at least this share of the graph
CANDIDATES = 4  # periods tried


@dataclass
class Blocks:
    members: list[list[int]]  # file positions of each block's layers, in order
    period: int  # layers per block

    @property
    def count(self) -> int:
        return len(self.members)

    @property
    def start(self) -> int:
        return self.members[0][0]

    def positions(self) -> set[int]:
        return {i for m in self.members for i in m}

    def describe(self, graph: "Graph") -> str:
        lays = list(graph)
        first, last = lays[self.members[0][0]], lays[self.members[-1][-1]]
        return (f"overview: {self.count} repeated blocks of {self.period} layers ({first.name} "
                f"… {last.name}) drawn as one group box; click it, 'whole graph' or search "
                f"to see every layer")


def find_blocks(graph: "Graph", *, min_repeats: int = MIN_REPEATS,
                min_layers: int = MIN_LAYERS) -> Blocks | None:
    """The longest run of repeated blocks in file order, or None when the graph has none
    worth collapsing (under `min_layers` layers, fewer than `min_repeats` repeats, or
    blocks covering under half of the graph)."""
    lays = list(graph)
    n = len(lays)
    if n < min_layers:
        return None
    ids: dict[tuple, int] = {}
    sig = [ids.setdefault((lay.type, len(lay.inputs), len(lay.outputs)), len(ids))
           for lay in lays]
    last: dict[int, int] = {}
    gaps: dict[int, Counter] = {}
    for i, s in enumerate(sig):
        if s in last:
            gaps.setdefault(s, Counter())[i - last[s]] += 1
        last[s] = i
    periods: Counter = Counter()
    for c in gaps.values():
        p, k = c.most_common(1)[0]
        if p >= 2 and k + 1 >= min_repeats:
            periods[p] = max(periods[p], k)
    best: Blocks | None = None
    for p, _ in sorted(periods.items(), key=lambda kv: -kv[1] * kv[0])[:CANDIDATES]:
        run_s, run_len, cur = 0, 0, 0
        for i in range(n - p):
            cur = cur + 1 if sig[i] == sig[i + p] else 0
            if cur > run_len:
                run_len, run_s = cur, i - cur + 1
        span = run_len + p  # sig[run_s : run_s + span] repeats every p
        count = span // p
        if count < min_repeats or count * p < MIN_COVER * n:
            continue
        if best is None or count * p > best.count * best.period:
            s0 = run_s + span - count * p  # aligned to the end: the start is where
            # the first block interleaves with the layers before the blocks (_extend finds it)
            best = Blocks([list(range(s0 + k * p, s0 + (k + 1) * p)) for k in range(count)], p)
    if best is not None:
        _extend(best, sig)
    return best


def _extend(blocks: Blocks, sig: list[int]) -> None:
    """Add the blocks before and after the run whose layers are interleaved with others
    (block 0 of a decoder shares its stretch of the file with the mask and rope tables):
    a block is the neighbour's signature sequence found as a subsequence within two
    periods of the file next to the run."""
    p = blocks.period
    while True:  # backwards, matching the first block's sequence from its end
        want = [sig[i] for i in blocks.members[0]]
        got: list[int] = []
        i = blocks.members[0][0] - 1
        lo = max(0, blocks.members[0][0] - 2 * p)
        while i >= lo and len(got) < p:
            if sig[i] == want[p - 1 - len(got)]:
                got.append(i)
            i -= 1
        if len(got) < p:
            break
        blocks.members.insert(0, got[::-1])
    taken = blocks.positions()
    while True:  # forwards, matching the last block's sequence from its start
        want = [sig[i] for i in blocks.members[-1]]
        got = []
        i = blocks.members[-1][-1] + 1
        hi = min(len(sig), i + 2 * p)
        while i < hi and len(got) < p:
            if i not in taken and sig[i] == want[len(got)]:
                got.append(i)
            i += 1
        if len(got) < p:
            break
        blocks.members.append(got)
        taken.update(got)


def overview_scene(graph: "Graph", blocks: Blocks, shapes: dict[str, str],
                   full_box_of: dict[str, int], full_svg_id: str) -> Scene:
    """The overview: every layer outside the blocks, the blocks as one group box (a
    click opens `full_svg_id` on block 0's first layer); wires to and from the group
    merged, one per layer on the other end."""
    lays = list(graph)
    run = blocks.positions()
    run_ids = {lays[i].id for i in run}
    # the layers before the group: those the run's end precedes that read nothing from the
    # run or from a layer after it; then the group; then the rest
    end = max(run)
    after: set[int] = set()
    before: list = []
    rest: list = []
    for pos, layer in enumerate(lays):
        if layer.id in run_ids:
            continue
        prods = [graph.producer(b) for b in layer.inputs]
        if pos > end or any(pr is not None and (pr.id in run_ids or pr.id in after)
                            for pr in prods):
            after.add(layer.id)
            rest.append(layer)
        else:
            before.append(layer)
    order = before + [lays[i] for i in sorted(run)] + rest
    scene = Scene()
    boxes, wires = scene.boxes, scene.wires
    box_of: dict[int, int] = {}
    missing: dict[str, int] = {}
    group = -1
    group_in: set[int] = set()
    group_out: list[str] = []
    for layer in order:
        if layer.id in run_ids:
            if group < 0:
                group = len(boxes)
                boxes.append(_group_box(graph, lays, blocks, full_box_of, full_svg_id))
            for blob in layer.inputs:
                prod = graph.producer(blob)
                if prod is not None and prod.id not in run_ids and prod.id in box_of:
                    src = box_of[prod.id]
                    if src not in group_in:
                        group_in.add(src)
                        wires.append(Wire(src, group, blob, prod.outputs.index(blob),
                                          len(prod.outputs), 0, 1))
            group_out.extend(b for b in layer.outputs if not graph.consumer_layers(b))
            box_of[layer.id] = group
            continue
        ins: list[tuple[int, int, int, str]] = []
        from_group = False
        for blob in layer.inputs:
            ps = graph.producer_slot(blob)
            if ps is not None and ps[0].id in box_of:
                src = box_of[ps[0].id]
                if src == group:
                    if from_group:
                        continue
                    from_group = True
                    ins.append((src, 0, 1, blob))
                else:
                    ins.append((src, ps[1], len(ps[0].outputs), blob))
                continue
            if blob not in missing:
                missing[blob] = len(boxes)
                boxes.append(Box(MISSING, blob, [clip(f"no producer: {blob}")],
                                 f"blob {blob} is read before it is written (or never is)",
                                 MISSING))
            ins.append((missing[blob], 0, 1, blob))
        me = add_layer(scene, box_of, layer, shapes, ins, len(ins))
        for blob in layer.outputs:
            scene.blob_labels.setdefault(blob, f"{blob} {shapes[blob]}" if blob in shapes
                                         else blob)
        for slot, blob in enumerate(layer.outputs):
            if not graph.consumer_layers(blob):
                pill = len(boxes)
                boxes.append(Box(OUTPUT, blob, [clip(f"output {blob}")], f"graph output {blob}",
                                 "io"))
                wires.append(Wire(me, pill, blob, slot, len(layer.outputs), 0, 1))
    if group_out:
        _outputs_pill(scene, group, group_out)
    return scene


def _outputs_pill(scene: Scene, group: int, outs: list[str]) -> None:
    pill = len(scene.boxes)
    scene.boxes.append(Box(OUTPUT, f"{len(outs)} outputs",
                           [f"{len(outs)} outputs", clip(f"{outs[0]} … {outs[-1]}")],
                           "graph outputs written by the blocks: " + " ".join(outs), "io"))
    scene.wires.append(Wire(group, pill, outs[0], 0, 1, 0, 1))


def _group_box(graph: "Graph", lays: list, blocks: Blocks, full_box_of: dict[str, int],
               full_svg_id: str) -> Box:
    one = [lays[i] for i in blocks.members[0]]
    types = Counter(lay.type for lay in one)
    summary = ", ".join(f"{t} {c}" if c > 1 else t for t, c in types.most_common())
    lines_t = wrap(summary, len(summary))  # every type, in lines of a box's width
    first, last = one[0], lays[blocks.members[-1][-1]]
    name = f"{blocks.count} × block"
    lines = [name, f"{blocks.period} layers each, {first.name} … {last.name}", *lines_t,
             "click to expand"]
    target = full_box_of.get(first.name)
    box = Box("group", name, lines,
              f"{blocks.count} repeated blocks of {blocks.period} layers: {summary}\n"
              f"click to draw every layer", "group",
              line_classes=["type", "name"] + ["params"] * len(lines_t) + ["weights"],
              expand=f"{full_svg_id}-n{target}" if target is not None else "")
    box.info = {"type": "group", "name": name, "in": [], "out": [],
                "params": [[i, lay.type, lay.name, 0] for i, lay in enumerate(one)],
                "note": [f"{blocks.count} blocks of {blocks.period} layers; block 0 listed "
                            f"below (position: type name)"]}
    return box
