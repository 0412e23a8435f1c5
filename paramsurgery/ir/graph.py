"""The IR: an ncnn graph as its layers in file order plus blob indexes, with a
`networkx.MultiDiGraph` view.

The layer order (what the `.param` lists, which ncnn requires to be topological) and the
blob indexes (producers and consumers per name) are the graph: every query and edit uses
them, so queries are O(1) and no edit rescans the graph. Every traversal is iterative.
`Graph.nx` is a view for networkx's algorithms, one of the graph's cached analyses (built on
first use, rebuilt after an edit, never kept in sync by the edits): nodes are layers (node
id = `Layer.id`, attribute ``layer``); each edge is one blob read by one consumer slot,
``producer -> consumer`` with key = the consumer's input slot and data
``{"blob", "src", "dst"}`` (producer slot, consumer slot).

ncnn semantics kept here (ncnn-format.md §1.2): a blob's producer is its first writer;
graph inputs are the tops of `Input` layers; graph outputs are blobs with a producer and no
consumer; a blob read by two different layers needs a `Split`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar, Union

import networkx as nx

from paramsurgery.core.errors import GraphError
from paramsurgery.ir.layer import Layer, _check_token
from paramsurgery.ir.params import Params

_GAP = 1 << 20  # spacing of order keys, so inserts rarely renumber

ParamsLike = Union[Params, Mapping[int, object], str, None]
LayerRef = Union[Layer, str, int]
T = TypeVar("T")


@dataclass
class Source:
    """Where a graph came from, and the bytes outside layer lines kept for round trip."""

    path: str | None = None
    format: str = "param"  # "param" (text) or "param.bin"
    header: bytes = b""  # magic + counts lines exactly as read
    declared_layers: int | None = None
    declared_blobs: int | None = None
    trailer: bytes = b""  # text after the last layer record (blank lines, ignored lines)
    ignored_lines: int = 0  # unparsable lines after the declared layer count (ncnn skips them)
    bin_path: str | None = None
    extra: dict = field(default_factory=dict)


def count_ncnn_blobs(layers: Iterable[Layer]) -> int:
    """The blobs ncnn's loader allocates for these layers read in order: one per top, plus
    one per bottom whose name no earlier layer wrote or read (what `blob_count()` computes
    from the graph's indexes; this is for a prefix of the layers)."""
    seen: set[str] = set()
    n = 0
    for layer in layers:
        for b in layer._inputs:
            if b not in seen:
                seen.add(b)
                n += 1
        n += len(layer._outputs)
        seen.update(layer._outputs)
    return n


class Graph:
    """An ncnn graph. Mutators return the graph (or the new layer) so calls chain:
    ``g.insert_after(l, "ReLU", "relu_x").graph.insert_splits().remove_dead()``."""

    def __init__(self) -> None:
        self._layers: dict[int, Layer] = {}
        self._next: dict[int, int | None] = {}
        self._prev: dict[int, int | None] = {}
        self._key: dict[int, int] = {}
        self._head: int | None = None
        self._tail: int | None = None
        self._next_id = 0
        self._producers: dict[str, list[tuple[int, int]]] = {}
        self._consumers: dict[str, list[tuple[int, int]]] = {}
        # layer name → its layer's id, or a list of ids for a name several layers share (a
        # list per name would cost two allocations per layer for the rare duplicate)
        self._by_name: dict[str, int | list[int]] = {}
        self._by_type: dict[str, dict[int, None]] = {}
        self._version = 0  # bumped by every edit: the key of the analysis cache
        self._analyses: dict[str, tuple[int, object]] = {}
        self._modified = False
        self._ids_in_order = True  # layer ids increase along the file order (until a reorder)
        self._blob_count: int | None = None  # cached distinct blob names; None = recount
        self.source = Source()
        self.weights: Any = None  # a paramsurgery.formats.weights model file when a .bin was loaded

    # ================================================================== construction
    @classmethod
    def _from_layers(cls, layers: list[Layer]) -> "Graph":
        """Bulk build for the readers: fills the indexes in one pass."""
        g = cls()
        producers = g._producers
        consumers = g._consumers
        by_type = g._by_type
        n = len(layers)
        # the order as a linked list and its keys, built in C (ids = positions at load); one
        # int object per id, shared by every index and tuple that holds it (a fresh int per
        # use cost ~200 bytes a layer)
        ids = list(range(n))
        g._layers = dict(zip(ids, layers))
        g._key = dict(zip(ids, range(0, n * _GAP, _GAP)))
        g._next = dict(zip(ids, [*ids[1:], None]))
        g._prev = dict(zip(ids, [None, *ids[:-1]]))
        # one string object per distinct blob name and type: the readers give each mention
        # its own copy; sharing them halves the names' memory and lets the index lookups
        # match by identity
        canon: dict[str, str] = {}
        intern = canon.setdefault
        for i, layer in zip(ids, layers):
            layer.id = i
            layer.graph = g
            g._name(layer._name, i)
            typ = layer._type = intern(layer._type, layer._type)
            t = by_type.get(typ)
            if t is None:
                by_type[typ] = {i: None}
            else:
                t[i] = None
            layer._inputs = _index_slots(consumers, layer._inputs, i, intern)
            layer._outputs = _index_slots(producers, layer._outputs, i, intern)
        prev_id = n - 1 if n else None
        g._head = 0 if layers else None
        g._tail = prev_id
        g._next_id = len(layers)
        return g

    @property
    def nx(self) -> nx.MultiDiGraph:
        """The graph as a `networkx.MultiDiGraph`: node = layer id (attribute ``layer``), one
        edge per blob read, ``producer -> consumer``, key = consumer slot, data ``blob``,
        ``src`` (producer slot), ``dst`` (consumer slot). An analysis: built on first access
        per edit version (loading and saving never need it); read-only for callers."""
        return self.analysis("networkx", _networkx_view)

    # ================================================================== queries
    def __len__(self) -> int:
        return len(self._layers)

    def __iter__(self) -> Iterator[Layer]:
        layers = self._layers
        nxt = self._next
        cur = self._head
        while cur is not None:
            yield layers[cur]
            cur = nxt[cur]

    @property
    def layers(self) -> list[Layer]:
        """Layers in file order."""
        return list(self)

    @property
    def modified(self) -> bool:
        return self._modified

    @property
    def _modified(self) -> bool:
        return self._modified_flag

    @_modified.setter
    def _modified(self, value: bool) -> None:
        # every edit path sets this (directly or through Layer._mark_edited), so it is where
        # the edit version moves and cached analyses go stale
        self._modified_flag = value
        self._version += 1

    @property
    def version(self) -> int:
        """A number that changes with every edit (layers, wiring, params, order)."""
        return self._version

    def analysis(self, key: str, compute: Callable[["Graph"], T]) -> T:
        """`compute(self)`, computed once per edit version and shared by every caller (lint
        rules, passes, validate): the way to avoid per-layer walks that rescan the graph.
        `key` names the analysis; the result must not be mutated by callers."""
        hit = self._analyses.get(key)
        if hit is not None and hit[0] == self._version:
            return hit[1]  # type: ignore[return-value]
        value = compute(self)
        self._analyses[key] = (self._version, value)
        return value

    def layer(self, ref: LayerRef) -> Layer:
        """A layer by object, id or name (the first with that name, in file order)."""
        if isinstance(ref, Layer):
            if ref.graph is not self:
                raise GraphError(f"layer {ref.name!r} is not in this graph")
            return ref
        if isinstance(ref, int):
            try:
                return self._layers[ref]
            except KeyError:
                raise GraphError(f"no layer with id {ref}") from None
        found = self.find(ref)
        if found is None:
            raise GraphError(f"no layer named {ref!r}")
        return found

    def find(self, name: str) -> Layer | None:
        ids = self._by_name.get(name)
        if ids is None:
            return None
        return self._layers[ids if isinstance(ids, int) else min(ids, key=self._key.__getitem__)]

    def by_type(self, *types: str) -> list[Layer]:
        """Layers of the given types, in file order."""
        ids: list[int] = []
        for t in types:
            ids.extend(self._by_type.get(t, ()))
        ids.sort(key=self._key.__getitem__)
        return [self._layers[i] for i in ids]

    def types(self) -> dict[str, int]:
        """Type histogram."""
        return {t: len(ids) for t, ids in self._by_type.items() if ids}

    def producer(self, blob: str) -> Layer | None:
        p = self._producers.get(blob)
        return self._layers[p[0][0]] if p else None

    def producer_slot(self, blob: str) -> tuple[Layer, int] | None:
        p = self._producers.get(blob)
        return (self._layers[p[0][0]], p[0][1]) if p else None

    def consumers(self, blob: str) -> list[tuple[Layer, int]]:
        """(layer, input slot) for every read of `blob`, in file order."""
        cons = self._consumers.get(blob, ())
        return [(self._layers[c], s) for c, s in sorted(cons, key=lambda cs: (self._key[cs[0]], cs[1]))]

    def consumer_layers(self, blob: str) -> list[Layer]:
        seen: dict[int, None] = {}
        for c, _ in self._consumers.get(blob, ()):
            seen[c] = None
        return [self._layers[c] for c in sorted(seen, key=self._key.__getitem__)]

    def has_blob(self, blob: str) -> bool:
        return blob in self._producers or blob in self._consumers

    def blob_names(self) -> list[str]:
        """Every blob name in ncnn's blob-index order (first appearance, top to bottom)."""
        seen: dict[str, None] = {}
        for layer in self:
            for b in layer._inputs:
                seen.setdefault(b, None)
            for b in layer._outputs:
                seen.setdefault(b, None)
        return list(seen)

    def blob_count(self) -> int:
        """The blobs ncnn allocates, which the header's blob_count must cover: one per top
        slot (a name written twice is two blobs), plus one per bottom read before any layer
        wrote it (ncnn's loader creates a blob for an unknown bottom name)."""
        if self._blob_count is None:
            producers = self._producers
            # ids compare like positions until a reorder: then no order-key lookups
            pos = None if self._ids_in_order else self._key
            n = sum(len(prods) for prods in producers.values())
            for b, cons in self._consumers.items():
                prods = producers.get(b)
                if not prods or _first(cons, pos) <= _first(prods, pos):
                    n += 1  # read first (a layer reads its bottoms before writing its tops)
            self._blob_count = n
        return self._blob_count

    def above_splits(self, blob: str) -> str:
        """The blob that `blob` copies through any chain of Splits (itself when its producer
        is no Split). A Split reading its own top (a cycle, PS105) ends the walk."""
        passed: set[int] = set()
        p = self.producer(blob)
        while p is not None and p._type == "Split" and p._inputs and p.id not in passed:
            passed.add(p.id)
            blob = p._inputs[0]
            p = self.producer(blob)
        return blob

    def predecessors(self, layer: LayerRef) -> list[Layer]:
        layer = self.layer(layer)
        out: dict[int, None] = {}
        for b in layer._inputs:
            p = self._producers.get(b)
            if p:
                out[p[0][0]] = None
        return [self._layers[i] for i in out]

    def successors(self, layer: LayerRef) -> list[Layer]:
        layer = self.layer(layer)
        out: dict[int, None] = {}
        for b in layer._outputs:
            for c, _ in self._consumers.get(b, ()):
                out[c] = None
        return [self._layers[i] for i in sorted(out, key=self._key.__getitem__)]

    @property
    def inputs(self) -> list[str]:
        """Graph inputs as ncnn defines them: every top of every `Input` layer, in order."""
        return [b for layer in self.by_type("Input") for b in layer._outputs]

    @property
    def outputs(self) -> list[str]:
        """Graph outputs as ncnn defines them: blobs with a producer and no consumer
        (unused Input tops included), in blob-index order."""
        cons = self._consumers
        return [b for b in self.blob_names() if b in self._producers and not cons.get(b)]

    def is_before(self, a: LayerRef, b: LayerRef) -> bool:
        return self._key[self.layer(a).id] < self._key[self.layer(b).id]

    def position(self) -> dict[int, int]:
        """Layer id → index in file order (O(n); compute once per analysis)."""
        return {layer.id: i for i, layer in enumerate(self)}

    def unique_blob_name(self, base: str) -> str:
        if not self.has_blob(base):
            return base
        i = 1
        while self.has_blob(f"{base}_{i}"):
            i += 1
        return f"{base}_{i}"

    def unique_layer_name(self, base: str) -> str:
        if base not in self._by_name:
            return base
        i = 1
        while f"{base}_{i}" in self._by_name:
            i += 1
        return f"{base}_{i}"

    # ================================================================== low-level index upkeep
    def _link_input(self, lid: int, slot: int, blob: str) -> None:
        self._blob_count = None
        self._consumers.setdefault(blob, []).append((lid, slot))

    def _unlink_input(self, lid: int, slot: int, blob: str) -> None:
        self._blob_count = None
        cons = self._consumers.get(blob)
        if cons is not None:
            cons.remove((lid, slot))
            if not cons:
                del self._consumers[blob]

    def _link_output(self, lid: int, slot: int, blob: str) -> None:
        self._blob_count = None
        p = self._producers.get(blob)
        if p is None:
            self._producers[blob] = [(lid, slot)]
        else:
            p.append((lid, slot))

    def _unlink_output(self, lid: int, slot: int, blob: str) -> None:
        self._blob_count = None
        p = self._producers[blob]
        p.remove((lid, slot))
        if not p:
            del self._producers[blob]

    def _retype_layer(self, layer: Layer, new: str) -> None:
        del self._by_type[layer._type][layer.id]
        self._by_type.setdefault(new, {})[layer.id] = None

    def _rename_layer(self, layer: Layer, new: str) -> None:
        self._unname(layer._name, layer.id)
        self._name(new, layer.id)

    def _name(self, name: str, lid: int) -> None:
        """Index layer `lid` under `name`."""
        by_name = self._by_name
        had = by_name.get(name)
        if had is None:
            by_name[name] = lid
        elif isinstance(had, list):
            had.append(lid)
        else:
            by_name[name] = [had, lid]

    def _unname(self, name: str, lid: int) -> None:
        """Drop layer `lid` from the index of `name`."""
        by_name = self._by_name
        had = by_name[name]
        if not isinstance(had, list):
            del by_name[name]
            return
        had.remove(lid)
        if len(had) == 1:
            by_name[name] = had[0]

    # ------------------------------------------------------------------ order upkeep
    def _order_link(self, lid: int, after: int | None) -> None:
        """Put `lid` right after `after` (None = at the head)."""
        if after != self._tail:
            self._ids_in_order = False
        nxt = self._head if after is None else self._next[after]
        lo = self._key[after] if after is not None else None
        hi = self._key[nxt] if nxt is not None else None
        if lo is None and hi is None:
            k = 0
        elif lo is None:
            assert hi is not None
            k = hi - _GAP
        elif hi is None:
            k = lo + _GAP
        elif hi - lo > 1:
            k = (lo + hi) // 2
        else:
            self._renumber()
            return self._order_link(lid, after)
        self._key[lid] = k
        self._join(after, lid)
        self._join(lid, nxt)

    def _order_unlink(self, lid: int) -> None:
        self._ids_in_order = False
        p, n = self._prev.pop(lid), self._next.pop(lid)
        del self._key[lid]
        self._join(p, n)

    def _join(self, p: int | None, n: int | None) -> None:
        """Make `n` follow `p` in the order list (None: `n` is the head / `p` the tail)."""
        if p is None:
            self._head = n
        else:
            self._next[p] = n
        if n is None:
            self._tail = p
        else:
            self._prev[n] = p

    def _renumber(self) -> None:
        cur, i = self._head, 0
        while cur is not None:
            self._key[cur] = i * _GAP
            cur = self._next[cur]
            i += 1

    # ================================================================== edits
    def add_layer(self, type: str, name: str, inputs: Sequence[str] = (),
                  outputs: Sequence[str] = (), params: ParamsLike = None, *,
                  before: LayerRef | None = None, after: LayerRef | None = None) -> Layer:
        """Add a layer. Without `before`/`after` it goes right after the last producer of its
        inputs (or after the last leading `Input` for layers without inputs), which keeps the
        order topological; a position that would not is refused."""
        layer = self._new_layer(type, name, inputs, outputs, params)
        return self._insert(layer, self._resolve_position(layer, before, after))

    def _new_layer(self, type: str, name: str, inputs: Sequence[str], outputs: Sequence[str],
                   params: ParamsLike) -> Layer:
        _check_token(type, "layer type")
        _check_token(name, "layer name")
        for b in list(inputs) + list(outputs):
            _check_token(b, "blob name")
        if len(set(outputs)) != len(outputs):
            raise GraphError(f"layer {name!r} lists a top twice")
        for b in outputs:
            if b in self._producers:
                raise GraphError(f"blob {b!r} already has a producer "
                                 f"({self._layers[self._producers[b][0][0]].name!r})")
        layer = Layer(type, name, list(inputs), list(outputs), None)
        _fill_params(layer, params)
        return layer

    def _insert(self, layer: Layer, after_id: int | None) -> Layer:
        """Register a new layer right after `after_id` (None = at the head)."""
        lid = self._next_id
        self._next_id += 1
        layer.id = lid
        layer.graph = self
        self._layers[lid] = layer
        self._order_link(lid, after_id)
        self._name(layer._name, lid)
        self._by_type.setdefault(layer._type, {})[lid] = None
        for slot, b in enumerate(layer._inputs):
            self._link_input(lid, slot, b)
        for slot, b in enumerate(layer._outputs):
            self._link_output(lid, slot, b)
        self._modified = True
        return layer

    def _resolve_position(self, layer: Layer, before: LayerRef | None,
                          after: LayerRef | None) -> int | None:
        if before is not None and after is not None:
            raise GraphError("give `before` or `after`, not both")
        if before is not None:
            return self._prev[self.layer(before).id]
        if after is not None:
            return self.layer(after).id
        lo: int | None = None
        for b in layer._inputs:
            p = self._producers.get(b)
            if p and (lo is None or self._key[p[0][0]] > self._key[lo]):
                lo = p[0][0]
        if lo is None and not layer._inputs:
            # a source layer: after the leading run of Input layers
            cur = self._head
            while cur is not None and self._layers[cur]._type == "Input":
                lo = cur
                cur = self._next[cur]
        hi_key = None
        for b in layer._outputs:
            for c, _ in self._consumers.get(b, ()):
                if hi_key is None or self._key[c] < hi_key:
                    hi_key = self._key[c]
        if hi_key is not None and lo is not None and self._key[lo] >= hi_key:
            raise GraphError(f"no topological position for {layer.name!r}: an input is produced "
                             f"after a consumer of its outputs")
        if hi_key is not None and lo is None:
            # before the first consumer
            first = min((c for b in layer._outputs for c, _ in self._consumers.get(b, ())),
                        key=self._key.__getitem__)
            return self._prev[first]
        return lo

    def remove_layer(self, layer: LayerRef) -> "Graph":
        """Remove a layer. Readers of its tops are left dangling (validate() reports them);
        use `bypass` to reconnect them or `remove_dead` for whole dead branches."""
        layer = self.layer(layer)
        lid = layer.id
        for slot, b in enumerate(layer._inputs):
            self._unlink_input(lid, slot, b)
        for slot, b in enumerate(layer._outputs):
            self._unlink_output(lid, slot, b)
        self._order_unlink(lid)
        del self._layers[lid]
        self._unname(layer._name, lid)
        del self._by_type[layer._type][lid]
        layer.graph = None
        self._modified = True
        return self

    def replace_layer(self, old: LayerRef, type: str, name: str | None = None,
                      inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None,
                      params: ParamsLike = None) -> Layer:
        """Put a new layer where `old` is (same position; same bottoms/tops by default)."""
        old = self.layer(old)
        ins = list(old._inputs if inputs is None else inputs)
        outs = list(old._outputs if outputs is None else outputs)
        prev = self._prev[old.id]
        self.remove_layer(old)
        return self._insert(self._new_layer(type, name or old.name, ins, outs, params), prev)

    def set_input(self, layer: LayerRef, slot: int, blob: str) -> "Graph":
        """Re-wire one bottom of `layer` to read `blob`."""
        layer = self.layer(layer)
        _check_token(blob, "blob name")
        old = layer._inputs[slot]
        if old == blob:
            return self
        self._unlink_input(layer.id, slot, old)
        layer._inputs = _with(layer._inputs, slot, blob)
        self._link_input(layer.id, slot, blob)
        layer._mark_edited()
        return self

    def set_inputs(self, layer: LayerRef, blobs: Sequence[str]) -> "Graph":
        """Replace the whole bottom list (e.g. SDPA 4 → 6 inputs)."""
        layer = self.layer(layer)
        blobs = list(blobs)
        for b in blobs:
            _check_token(b, "blob name")
        return self._relist(layer, blobs, tops=False)

    def set_outputs(self, layer: LayerRef, blobs: Sequence[str]) -> "Graph":
        """Replace the whole top list. New tops must not have another producer."""
        layer = self.layer(layer)
        blobs = list(blobs)
        if len(set(blobs)) != len(blobs):
            raise GraphError(f"layer {layer.name!r} would list a top twice")
        for b in blobs:
            _check_token(b, "blob name")
            p = self._producers.get(b)
            if p and p[0][0] != layer.id:
                raise GraphError(f"blob {b!r} already has a producer "
                                 f"({self._layers[p[0][0]].name!r})")
        return self._relist(layer, blobs, tops=True)

    def _relist(self, layer: Layer, blobs: list[str], *, tops: bool) -> "Graph":
        """Replace `layer`'s whole bottom (or top) list, re-linking every slot."""
        old = layer._outputs if tops else layer._inputs
        new = tuple(blobs)
        if new == old:
            return self
        unlink, link = ((self._unlink_output, self._link_output) if tops
                        else (self._unlink_input, self._link_input))
        for slot, b in enumerate(old):
            unlink(layer.id, slot, b)
        if tops:
            layer._outputs = new
        else:
            layer._inputs = new
        for slot, b in enumerate(new):
            link(layer.id, slot, b)
        layer._mark_edited()
        return self

    def rename_blob(self, old: str, new: str) -> "Graph":
        """Rename a blob everywhere it is written or read."""
        if old == new:
            return self
        _check_token(new, "blob name")
        if not self.has_blob(old):
            raise GraphError(f"no blob named {old!r}")
        if self.has_blob(new):
            raise GraphError(f"blob {new!r} already exists")
        prods = list(self._producers.get(old, ()))
        cons = list(self._consumers.get(old, ()))
        for lid, slot in cons:
            self._unlink_input(lid, slot, old)
        for lid, slot in prods:
            self._unlink_output(lid, slot, old)
        for lid, slot in prods:
            writer = self._layers[lid]
            writer._outputs = _with(writer._outputs, slot, new)
            self._link_output(lid, slot, new)
            writer._mark_edited()
        for lid, slot in cons:
            reader = self._layers[lid]
            reader._inputs = _with(reader._inputs, slot, new)
            self._link_input(lid, slot, new)
            reader._mark_edited()
        self._modified = True
        return self

    def replace_uses(self, old: str, new: str, *, except_layers: Iterable[LayerRef] = ()) -> "Graph":
        """Make every reader of blob `old` read `new` instead."""
        skip = {self.layer(x).id for x in except_layers}
        for lid, slot in list(self._consumers.get(old, ())):
            if lid not in skip:
                self.set_input(lid, slot, new)
        return self

    def insert_after(self, layer: LayerRef, type: str, name: str, params: ParamsLike = None, *,
                     slot: int = 0, new_blob: str | None = None) -> Layer:
        """Insert a 1→1 layer on top `slot` of `layer`. The inserted layer takes over the
        blob's name (so graph outputs and readers keep their names); `layer`'s top is renamed
        to `new_blob` (default: a fresh name)."""
        layer = self.layer(layer)
        blob = layer._outputs[slot]
        mid = new_blob or self.unique_blob_name(f"{blob}_pre")
        if self.has_blob(mid):
            raise GraphError(f"blob {mid!r} already exists")
        self._unlink_output(layer.id, slot, blob)
        layer._outputs = _with(layer._outputs, slot, mid)
        self._link_output(layer.id, slot, mid)
        layer._mark_edited()
        return self.add_layer(type, name, [mid], [blob], params, after=layer)

    def insert_before(self, layer: LayerRef, type: str, name: str, params: ParamsLike = None, *,
                      slot: int = 0, new_blob: str | None = None) -> Layer:
        """Insert a 1→1 layer on bottom `slot` of `layer`, right before it."""
        layer = self.layer(layer)
        blob = layer._inputs[slot]
        out = new_blob or self.unique_blob_name(f"{blob}_{name}")
        new = self.add_layer(type, name, [blob], [out], params, before=layer)
        self.set_input(layer, slot, out)
        return new

    def bypass(self, layer: LayerRef) -> "Graph":
        """Remove a pass-through layer and connect the readers of its top i to its bottom i
        (bottom 0 for all tops when it has one bottom, as for Split). A top nobody reads
        (a graph output) gives its name to the bottom, so the output name survives."""
        layer = self.layer(layer)
        ins, outs = list(layer._inputs), list(layer._outputs)
        if not ins:
            raise GraphError(f"cannot bypass {layer.name!r}: it has no bottoms")
        if len(ins) != 1 and len(ins) < len(outs):
            raise GraphError(f"cannot bypass {layer.name!r}: {len(outs)} tops but {len(ins)} bottoms")
        mapping = [ins[0] if len(ins) == 1 else ins[i] for i in range(len(outs))]
        self.remove_layer(layer)
        for out, src in zip(outs, mapping):
            readers = list(self._consumers.get(out, ()))
            if readers:
                for lid, slot in readers:
                    self.set_input(lid, slot, src)
            elif (src in self._producers and not self._consumers.get(src)
                  and not self.has_blob(out)):
                self.rename_blob(src, out)
        return self

    def insert_splits(self) -> "Graph":
        """Give every blob read by more than one layer a `Split` (ncnn segfaults without it).
        A layer reading the same blob twice needs none."""
        for blob in list(self._consumers):
            readers = self._consumers.get(blob, ())
            layers_reading = {c for c, _ in readers}
            if len(layers_reading) < 2 or blob not in self._producers:
                continue
            ordered = sorted(layers_reading, key=self._key.__getitem__)
            names = [self.unique_blob_name(f"{blob}_splitncnn_{i}") for i in range(len(ordered))]
            prod = self._producers[blob][0][0]
            split = self.add_layer("Split", self.unique_layer_name(f"splitncnn_{blob}"), [blob],
                                   [], None, after=prod)
            outs = []
            for i, _c in enumerate(ordered):
                nb = names[i]
                while self.has_blob(nb) or nb in outs:
                    nb = self.unique_blob_name(nb + "_")
                outs.append(nb)
            self.set_outputs(split, outs)
            for c, nb in zip(ordered, outs):
                for lid, slot in [cs for cs in list(self._consumers[blob]) if cs[0] == c]:
                    self.set_input(lid, slot, nb)
        return self

    def remove_trivial_splits(self) -> "Graph":
        """Bypass `Split` layers with a single top (they copy nothing useful)."""
        for layer in self.by_type("Split"):
            if len(layer._outputs) <= 1 and len(layer._inputs) == 1:
                self.bypass(layer)
        return self

    def remove_dead(self, candidates: Iterable[LayerRef] | None = None,
                    keep: Iterable[str] = ()) -> list[str]:
        """Remove layers none of whose tops is read, starting from `candidates` (default: all
        layers) and following their producers (worklist, no recursion). Blobs in `keep` and
        the tops of `Input` layers are never removed. Returns the removed layer names."""
        keep = set(keep)
        work = [self.layer(c).id for c in candidates] if candidates is not None \
            else list(self._layers)
        removed: list[str] = []
        seen_dead: set[int] = set()
        while work:
            lid = work.pop()
            layer = self._layers.get(lid)
            if layer is None or lid in seen_dead or layer._type == "Input":
                continue
            if any(self._consumers.get(b) or b in keep for b in layer._outputs):
                continue
            if not layer._outputs and candidates is None:
                continue
            preds = [self._producers[b][0][0] for b in layer._inputs if self._producers.get(b)]
            seen_dead.add(lid)
            removed.append(layer.name)
            self.remove_layer(layer)
            work.extend(preds)
        return removed

    def toposort(self) -> "Graph":
        """Reorder layers topologically, keeping the current order wherever it is already
        valid (Kahn's algorithm with the old position as priority; iterative)."""
        pos = self.position()
        indeg: dict[int, int] = {}
        for lid, layer in self._layers.items():
            deps = {self._producers[b][0][0] for b in layer._inputs if self._producers.get(b)}
            deps.discard(lid)
            indeg[lid] = len(deps)
        heap = [(pos[lid], lid) for lid, d in indeg.items() if d == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, lid = heapq.heappop(heap)
            order.append(lid)
            succ = set()
            for b in self._layers[lid]._outputs:
                p = self._producers.get(b)
                if p and p[0][0] == lid:
                    for c, _ in self._consumers.get(b, ()):
                        if c != lid:
                            succ.add(c)
            for c in succ:
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(heap, (pos[c], c))
        if len(order) != len(self._layers):
            stuck = sorted((lid for lid, d in indeg.items() if d > 0), key=pos.__getitem__)
            names = ", ".join(repr(self._layers[i].name) for i in stuck[:5])
            raise GraphError(f"the graph has a cycle through {names}")
        if order != sorted(order, key=pos.__getitem__):
            self._ids_in_order = False
            prev = None
            self._head = self._tail = None
            for lid in order:
                self._next[lid] = None
                self._prev[lid] = prev
                if prev is None:
                    self._head = lid
                else:
                    self._next[prev] = lid
                prev = lid
            self._tail = prev
            self._renumber()
            self._modified = True
        return self

    def move_after(self, layer: LayerRef, after: LayerRef | None) -> "Graph":
        """Move a layer to right after another one (None = to the head)."""
        layer = self.layer(layer)
        after_id = self.layer(after).id if after is not None else None
        if after_id == layer.id:
            return self
        self._order_unlink(layer.id)
        self._order_link(layer.id, after_id)
        self._modified = True
        return self

    def mark_modified(self) -> "Graph":
        self._modified = True
        return self

    # ================================================================== copies
    def copy(self) -> "Graph":
        """An independent copy (for rollback): same layers, params, raw text and weights."""
        from paramsurgery.core.collector import paused_gc

        with paused_gc():  # allocation-heavy: collections would make it superlinear
            return self._copy()

    def _copy(self) -> "Graph":
        layers = []
        for layer in self:
            new = Layer(layer._type, layer._name, layer._inputs, layer._outputs, None)
            new.params = _copy_params(layer.params, new)
            new.source_file = layer.source_file
            new.source_line = layer.source_line
            new.origin, new._edited = layer.origin, layer._edited
            new.weights = layer.weights
            if layer._meta:
                new.meta = dict(layer._meta)
            layers.append(new)
        g = Graph._from_layers(layers)
        g.source = Source(**{**self.source.__dict__, "extra": dict(self.source.extra)})
        g._modified = self._modified
        g.weights = self.weights
        return g

    def __repr__(self) -> str:
        from paramsurgery.core.text import count

        return f"<Graph {count(len(self), 'layer')}, {count(self.blob_count(), 'blob')}" + \
            (f" from {self.source.path}>" if self.source.path else ">")


def _index_slots(index: dict[str, list[tuple[int, int]]], blobs: Iterable[str], i: int,
                 intern: Callable[[str, str], str]) -> tuple[str, ...]:
    """Bulk build: record layer `i`'s slots of `blobs` in `index` (blob -> [(id, slot)],
    the producers' or the consumers'); the blob names, interned."""
    names = tuple(map(intern, blobs, blobs))
    for slot, b in enumerate(names):
        at = index.get(b)
        if at is None:
            index[b] = [(i, slot)]
        else:
            at.append((i, slot))
    return names


def _with(blobs: tuple[str, ...], slot: int, blob: str) -> tuple[str, ...]:
    """`blobs` with the name in `slot` replaced."""
    return (*blobs[:slot], blob, *blobs[slot + 1:])


def _first(slots: list[tuple[int, int]], pos: Mapping[int, int] | None) -> int:
    """The order key of the first of these (layer id, slot) mentions; with `pos` None, ids
    are the keys (they increase along the file order until a reorder)."""
    if pos is None:
        return slots[0][0] if len(slots) == 1 else min(lid for lid, _ in slots)
    if len(slots) == 1:
        return pos[slots[0][0]]
    return min(pos[lid] for lid, _ in slots)


def _copy_params(params: Params, owner: Layer) -> Params:
    if params.source_text() is not None:  # unedited: the text says it all, parse on demand
        return Params(params._text, owner)
    p = params.copy(owner)
    p._text = params._text
    p.edited = params.edited
    p._dupes = params._dupes  # a tuple: shared, never edited in place
    return p


def _fill_params(layer: Layer, params: ParamsLike) -> None:
    """Give a new layer its params; ids ncnn reads as floats become floats (layer_params)."""
    if params is None:
        return
    if isinstance(params, Params):
        layer.params = params
        params._owner = layer
        return
    if isinstance(params, str):
        p = Params(" " + params, layer)
        p.check()
        layer.params = p
        return
    for k, v in params.items():
        layer.params.set(int(k), v)


def _networkx_view(g: "Graph") -> nx.MultiDiGraph:
    G = nx.MultiDiGraph()
    node, succ, pred = G._node, G._succ, G._pred  # direct fill: ~3x faster than add_edge
    for lid, layer in g._layers.items():
        node[lid] = {"layer": layer}
        succ[lid] = {}
        pred[lid] = {}
    producers = g._producers
    for b, cons in g._consumers.items():
        p = producers.get(b)
        if not p:
            continue
        u, us = p[0]
        su = succ[u]
        for c, slot in cons:
            e = su.get(c)
            if e is None:
                e = su[c] = {}
                pred[c][u] = e
            e[slot] = {"blob": b, "src": us, "dst": slot}
    return G
