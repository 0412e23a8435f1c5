"""One constant table where a pass emitted several equal ones.

`lower`'s rules and the thaw of a folded length each emit their own `MemoryData` table (a
ones or arange table of `ARANGE_TABLE` = 32768 floats, 128 KiB) and crop it to the extent
they need. Tables with the same params and the same stored bytes hold the same values, so
every reader can read one of them: the first in file order (it precedes every reader of the
others, which follow their own table) is kept, the others' readers read it and the others
are removed. Only tables the pass itself added are merged; the graph's own constants are not
touched (a model may keep equal tables apart on purpose, and they are the input's bytes).
`Graph.insert_splits` gives the kept table's readers their Split afterwards.
"""

from __future__ import annotations

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.changes import Change


def share_added_tables(g: Graph, existing: set[int]) -> list[Change]:
    """Merge the `MemoryData` layers of `g` not in `existing` (layer ids from before the
    pass) that have equal params and weights; returns one change per merged group."""
    groups: dict[tuple[str, str], list[Layer]] = {}
    for layer in g.by_type("MemoryData"):
        if layer.id in existing or not layer.weights or len(layer.outputs) != 1:
            continue
        key = (" ".join(layer.params.tokens()), layer.weights.sha256)
        groups.setdefault(key, []).append(layer)
    changes: list[Change] = []
    position = None
    for tables in groups.values():
        if len(tables) < 2:
            continue
        if position is None:
            position = g.position()
        tables.sort(key=lambda lay: position[lay.id])
        kept, *merged = tables
        for layer in merged:
            g.replace_uses(layer.outputs[0], kept.outputs[0])
            g.remove_layer(layer)
        changes.append(Change(kept.name, f"shared table [{len(tables)} equal MemoryData "
                                         f"tables the pass added: one is read by all]",
                              ", ".join(lay.name for lay in merged), f"reads {kept.name}",
                              kept.source_line))
    return changes
