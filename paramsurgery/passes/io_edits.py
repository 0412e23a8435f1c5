"""Edits of a graph's interface: merge `Input` layers, rename blobs
(`paramsurgery merge-inputs`, `paramsurgery rename-blobs`).

`MergeInputs`: many per-layer cache `Input`s (or any graph inputs) become one multi-top
`Input`, as ncnn_llm's `--merge-kv-cache-input` does by hand and as ncnn's benchmark LLM
params have it (`Input kv_cache 0 2n cache_k0 cache_v0 ...`). The tops keep their names, so
nothing reading them changes; ncnn's input names (every top of every Input) stay the same
set, in the order given. The merged layer sits where the first of the merged Inputs was (so
every reader still comes after it); Inputs left without tops are removed.

`RenameBlobs`: explicit `OLD=NEW` renames and/or the cache blobs of every attention layer
with a native kv cache (`7=1`) renamed to a convention (`ncnn-docs`: `cache_k_in_{i}` /
`cache_k_out_{i}`, `ncnn-llm`: `cache_k{i}` / `out_cache_k{i}`; `i` = the layer's ordinal
among all attention layers, as `add-kvcache` numbers them) -- ncnn_llm's
`--rename-full-decoder-io` (`in4..`/`out1..` → `cache_k{i}`/`out_cache_k{i}`). All renames
apply at once (a swap `a=b b=a` works); a rename onto a name that stays in use, two renames
onto one name, or an unknown blob is refused.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, field
from typing import Mapping, Sequence

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer, _check_token
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.passes.kvcache import NAMINGS, cache_slots


def _token(value: str, what: str) -> None:
    try:
        _check_token(value, what)
    except ValueError as exc:
        raise PassRefused(str(exc)) from None


def kv_cache_inputs(g: Graph) -> list[str]:
    """The cache input blobs of every attention layer with `7=1`, k then v, in layer order."""
    return [b for s in cache_slots(g) for b in (s.k_in, s.v_in)]


# ============================================================================ merge-inputs

class MergeInputs(Pass, name="merge-inputs",
                  summary="merge graph inputs (e.g. per-layer kv-cache Inputs) into one multi-top Input"):
    inputs: Sequence[str] | None = None
    _: KW_ONLY
    layer_name: str = "kv_cache"
    kv_cache: bool = False

    def __post_init__(self) -> None:
        if self.inputs is None and not self.kv_cache:
            raise PassRefused("say which inputs: --inputs a,b,... or --kv-cache")
        if self.inputs is not None and self.kv_cache:
            raise PassRefused("give --inputs or --kv-cache, not both")
        _token(self.layer_name, "layer name")
        if self.inputs is not None:
            object.__setattr__(self, "inputs", tuple(self.inputs))

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        blobs = kv_cache_inputs(g) if self.kv_cache else list(self.inputs or [])
        if self.kv_cache and not blobs:
            raise PassRefused("no attention layer has a native kv cache (7=1): run add-kvcache "
                              "or fold-explicit-cache first")
        if len(blobs) < 2:
            raise PassRefused(f"need at least two inputs to merge, got {len(blobs)}")
        dupes = sorted({b for b in blobs if blobs.count(b) > 1})
        if dupes:
            raise PassRefused(f"listed twice: {', '.join(dupes)}")
        holders: dict[int, Layer] = {}
        for b in blobs:
            prod = g.producer(b)
            if prod is None:
                raise PassRefused(f"no blob {b!r} is written in the graph" if not g.has_blob(b)
                                  else f"blob {b!r} has no producer")
            if prod.type != "Input":
                raise PassRefused(f"{b!r} is not a graph input: {prod.type} {prod.name!r} "
                                  f"writes it", file=prod.source_file, line=prod.source_line)
            holders[prod.id] = prod
        pos = g.position()
        layers = sorted(holders.values(), key=lambda lay: pos[lay.id])
        target = g.find(self.layer_name)
        if (len(layers) == 1 and layers[0].name == self.layer_name
                and list(layers[0].outputs) == blobs):
            result.notes.append(f"Input {self.layer_name!r} already holds exactly these inputs")
            return result
        keeps = {lay.id: [b for b in lay.outputs if b not in blobs] for lay in layers}
        if target is not None and not (target.id in holders and not keeps[target.id]):
            raise PassRefused(f"a layer named {self.layer_name!r} already exists "
                              f"({target.type}, line {target.source_line}); choose --name")
        hints = {lay.name: lay.params.to_dict() for lay in layers}
        distinct = {tuple(sorted(h.items())) for h in hints.values()}
        if len(distinct) > 1:
            detail = "; ".join(f"{n}: {' '.join(f'{k}={v}' for k, v in h.items()) or 'none'}"
                               for n, h in hints.items())
            raise PassRefused(f"the Inputs carry different shape hints ({detail}); one Input "
                              f"gives all its tops the same hints")
        params = layers[0].params.copy()
        first = layers[0]
        anchor = next((lay for lay in _before(g, first)), None)
        for lay in layers:
            if keeps[lay.id]:
                g.set_outputs(lay, keeps[lay.id])
            else:
                g.remove_layer(lay)
        where = dict(after=anchor) if anchor is not None else \
            dict(before=next(iter(g))) if len(g) else {}
        g.add_layer("Input", self.layer_name, [], blobs, params if len(params) else None,
                    **where)
        result.changes.append(Change(self.layer_name, f"Input with {len(blobs)} tops "
                                     f"({' '.join(blobs)}) replaces the Input layer(s) "
                                     f"{', '.join(lay.name for lay in layers)}",
                                     line=first.source_line))
        kept = [lay.name for lay in layers if keeps[lay.id]]
        if kept:
            result.notes.append(f"kept the other tops of {', '.join(kept)}")
        result.modified = True
        return result


def _before(g: Graph, layer: Layer) -> list[Layer]:
    """The layer right before `layer` in file order (as a 0/1-element list)."""
    prev = None
    for cur in g:
        if cur is layer:
            return [prev] if prev is not None else []
        prev = cur
    return []


# ============================================================================ rename-blobs

class RenameBlobs(Pass, name="rename-blobs",
                  summary="rename blobs (explicit OLD=NEW, or every kv-cache blob to a naming convention)"):
    renames: Mapping[str, str] | Sequence[str] = ()  # {OLD: NEW} or "OLD=NEW" texts
    _: KW_ONLY
    cache_naming: str | None = None
    pairs: tuple[tuple[str, str], ...] = field(init=False, default=())  # from `renames`

    def __post_init__(self) -> None:
        renames, cache_naming = self.renames, self.cache_naming
        if cache_naming is not None and cache_naming not in NAMINGS:
            raise PassRefused(f"unknown naming {cache_naming!r} (choose from "
                              f"{', '.join(NAMINGS)})")
        pairs: list[tuple[str, str]] = []
        if isinstance(renames, Mapping):
            pairs = list(renames.items())
        else:
            for text in renames:
                old, eq, new = text.partition("=")
                if not eq or not old or not new:
                    raise PassRefused(f"expected OLD=NEW, got {text!r}")
                pairs.append((old, new))
        for _old, new in pairs:
            _token(new, "blob name")
        if not pairs and cache_naming is None:
            raise PassRefused("nothing to rename: give OLD=NEW pairs or --cache-naming")
        object.__setattr__(self, "pairs", tuple(pairs))

    def _mapping(self, g: Graph, result: PassResult) -> dict[str, str]:
        mapping: dict[str, str] = {}
        why: dict[str, str] = {}

        def add(old: str, new: str, source: str) -> None:
            if old in mapping and mapping[old] != new:
                raise PassRefused(f"{old!r} would be renamed twice: to {mapping[old]!r} "
                                  f"({why[old]}) and to {new!r} ({source})")
            mapping[old] = new
            why[old] = source

        if self.cache_naming is not None:
            slots = cache_slots(g)
            if not slots:
                raise PassRefused("no attention layer has a native kv cache (7=1): nothing "
                                  "for --cache-naming to rename")
            fmt = NAMINGS[self.cache_naming]
            for s in slots:
                names = [f.format(i=s.index) for f in fmt[:4]]
                for old, nw in zip((s.k_in, s.v_in, s.k_out, s.v_out), names):
                    add(old, nw, f"{self.cache_naming} cache of {s.layer}")
        for old, new in self.pairs:
            add(old, new, "explicit")
        missing = [old for old in mapping if not g.has_blob(old)]
        if missing:
            raise PassRefused(f"no blob named {', '.join(repr(m) for m in missing)}")
        mapping = {o: n for o, n in mapping.items() if o != n}
        targets: dict[str, str] = {}
        for old, new in mapping.items():
            if new in targets:
                raise PassRefused(f"{targets[new]!r} and {old!r} would both be named {new!r}")
            targets[new] = old
            if g.has_blob(new) and new not in mapping:
                users = [lay.name for lay, _ in g.consumers(new)]
                prod = g.producer(new)
                who = f"written by {prod.name!r}" if prod is not None else \
                    f"read by {', '.join(users)}"
                raise PassRefused(f"cannot rename {old!r} to {new!r}: blob {new!r} exists "
                                  f"({who})")
        return mapping

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        mapping = self._mapping(g, result)
        if not mapping:
            result.notes.append("every blob already has its name")
            return result
        # two phases, so swaps and chains (a=b b=c) never collide
        temp: dict[str, str] = {}
        for old in mapping:
            t = g.unique_blob_name(f"__paramsurgery_rename_{len(temp)}")
            g.rename_blob(old, t)
            temp[old] = t
        order = {b: i for i, b in enumerate(g.blob_names())}
        for old, new in sorted(mapping.items(), key=lambda kv: order[temp[kv[0]]]):
            g.rename_blob(temp[old], new)
            prod = g.producer(new)
            result.changes.append(Change(prod.name if prod is not None else new, "blob", old, new,
                                         prod.source_line if prod is not None else None))
        if self.cache_naming is not None:
            self._rename_cache_input(g, result)
        result.modified = True
        return result

    def _rename_cache_input(self, g: Graph, result: PassResult) -> None:
        """The one Input holding exactly the cache inputs takes the convention's name."""
        assert self.cache_naming is not None  # run() calls this only with a naming
        want = NAMINGS[self.cache_naming][4]
        blobs = set(kv_cache_inputs(g))
        holders = {p.id: p for p in map(g.producer, blobs) if p is not None}
        if len(holders) != 1:
            return
        (layer,) = holders.values()
        if layer.type != "Input" or set(layer.outputs) != blobs or layer.name == want:
            return
        if g.find(want) is not None:
            result.notes.append(f"kept Input {layer.name!r}: a layer named {want!r} exists")
            return
        old = layer.name
        layer.name = want
        result.changes.append(Change(want, "Input layer name", old, want, layer.source_line))
