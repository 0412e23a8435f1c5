"""Insert a 1 → 1 layer on an edge (`paramsurgery insert`).

ncnn_llm's `--reshape-residual-adds` inserts a `Reshape` before chosen residual BinaryOps by
editing lines and renumbering blobs by hand; here it is one edit on the IR:

    paramsurgery insert m.param --before add_17:1 --type Reshape --name add_17_rs 0=2560 1=-1
    paramsurgery insert m.param --before add_17:1 add_23:1 --type Reshape --name '{layer}_rs' 0=2560 1=-1
    paramsurgery insert m.param --after gemm_3 --type ReLU --name gemm_3_relu

`--before LAYER[:SLOT]` puts the new layer on bottom SLOT of LAYER (default 0): it reads that
blob and LAYER reads its output. `--after LAYER[:SLOT]` puts it on top SLOT: it takes over the
blob's name (so readers and graph outputs keep theirs) and LAYER writes `<blob>_pre`. Params
are typed as `set-param` types them. `{layer}` / `{slot}` in the name make one name per target.

Refused: a type ncnn does not have (with the closest names), a layer whose params read weights
(the `.bin` has no index: every later weight would shift), a name already used, an unknown
layer or slot, and a layer ncnn's own `load_param` rejects. Running the same insert again
changes nothing (the layer is already on that edge).
"""

from __future__ import annotations

import difflib
from dataclasses import KW_ONLY, field
from typing import Sequence

from paramsurgery.core.match import MatchFailure
from paramsurgery.analysis.contracts import arity
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer, _check_token
from paramsurgery.core.layer_types import NCNN_LAYER_TYPES, is_ncnn_layer
from paramsurgery.ir.params import Params
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.passes.set_param import apply_params, check_loads


def parse_target(text: str) -> tuple[str, int]:
    """`LAYER` or `LAYER:SLOT` (layer names may contain ':'; the last one splits)."""
    name, sep, slot = text.rpartition(":")
    if sep and slot.isdigit() and name:
        return name, int(slot)
    return text, 0


class InsertLayer(Pass, name="insert",
                  summary="insert a 1 -> 1 layer before a layer's bottom or after its top"):
    layer_type: str
    layer_name: str
    _: KW_ONLY
    before: Sequence[str] = ()
    after: Sequence[str] = ()
    assignments: Sequence[str] = ()
    force: bool = False
    # derived in __post_init__: which side, the parsed LAYER[:SLOT] targets, the checked params
    side: str = field(init=False, default="")
    targets: tuple[tuple[str, int], ...] = field(init=False, default=())
    # set by __post_init__ (never None after it)
    _params: Params = field(init=False, default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        before, after, layer_type, layer_name = (self.before, self.after, self.layer_type,
                                                 self.layer_name)
        if bool(before) == bool(after):
            raise PassRefused("give --before LAYER[:SLOT]... or --after LAYER[:SLOT]...")
        if not is_ncnn_layer(layer_type):
            lower = {t.lower(): t for t in NCNN_LAYER_TYPES}
            close = [lower[c] for c in difflib.get_close_matches(layer_type.lower(), lower, n=3,
                                                                 cutoff=0.6)]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise PassRefused(f"ncnn has no layer type {layer_type!r}{hint}")
        targets = [parse_target(t) for t in (before or after)]
        if len(targets) > 1 and "{layer}" not in layer_name and "{slot}" not in layer_name:
            raise PassRefused(f"{len(targets)} targets need {len(targets)} names: put {{layer}} "
                              f"(and/or {{slot}}) in --name")
        object.__setattr__(self, "side", "before" if before else "after")
        object.__setattr__(self, "targets", tuple(targets))
        object.__setattr__(self, "assignments", tuple(self.assignments))
        object.__setattr__(self, "_params", self._check_params())

    def _check_params(self) -> Params:
        """Params typed, no weights, accepted by ncnn's load_param (checked on a probe)."""
        from paramsurgery.formats.weights.schema import SchemaError, reads_for

        probe = Layer(self.layer_type, "probe", ["x"], ["y"], Params())
        apply_params(probe, self.assignments, force=self.force)
        try:
            reads = reads_for(self.layer_type, probe.params)
        except SchemaError as exc:
            raise PassRefused(f"{self.layer_type} with these params: {exc.message}") from None
        fixed = arity(self.layer_type, probe.params)  # ncnn's contract table (validate PS113)
        need = fixed[0] if fixed is not None and (fixed[0] > 1 or fixed[2] > 1) else 0
        if need:
            hint = " (set 1=1 and 2=<scalar> for an operation with a constant)" \
                if self.layer_type == "BinaryOp" else ""
            raise PassRefused(f"{self.layer_type} reads {need} bottoms; insert puts a layer on "
                              f"one edge (1 -> 1){hint}")
        if reads:
            what = ", ".join(f"{r.role}[{r.count}]" for r in reads)
            raise PassRefused(f"{self.layer_type} with these params reads weights from the .bin "
                              f"({what}); the .bin has no index, so inserting it would shift "
                              f"every later weight")
        return probe.params

    def _name(self, layer: str, slot: int) -> str:
        name = self.layer_name.replace("{layer}", layer).replace("{slot}", str(slot))
        try:
            _check_token(name, "layer name")
        except ValueError as exc:
            raise PassRefused(str(exc)) from None
        return name

    def _already(self, g: Graph, target: Layer, slot: int, name: str) -> bool:
        """The same layer is already on that edge (a second run)."""
        if self.side == "before":
            prev = g.producer(target.inputs[slot])
            cands = [prev] if prev is not None else []
        else:
            cands = g.consumer_layers(target.outputs[slot])
        return any(c.name == name and c.type == self.layer_type and c.params == self._params
                   and len(c.inputs) == 1 and len(c.outputs) == 1 for c in cands)

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        names: set[str] = set()
        plan: list[tuple[Layer, int, str]] = []
        for lname, slot in self.targets:
            target = g.find(lname)
            if target is None:
                raise PassRefused(f"no layer named {lname!r}")
            blobs = target.inputs if self.side == "before" else target.outputs
            if slot >= len(blobs):
                what = "bottoms" if self.side == "before" else "tops"
                raise PassRefused(f"{target.type} {lname!r} has {len(blobs)} {what}; there is no "
                                  f"slot {slot}", file=target.source_file,
                                  line=target.source_line)
            name = self._name(lname, slot)
            if name in names:
                raise PassRefused(f"two targets would both get the name {name!r}")
            names.add(name)
            if self._already(g, target, slot, name):
                result.skipped.append(MatchFailure(name, f"already {self.side} {lname}:{slot}",
                                                   line=target.source_line))
                continue
            other = g.find(name)
            if other is not None:
                raise PassRefused(f"a layer named {name!r} already exists ({other.type}, "
                                  f"line {other.source_line})")
            plan.append((target, slot, name))
        for target, slot, name in plan:
            params = self._params.copy()
            if self.side == "before":
                blob = target.inputs[slot]
                new = g.insert_before(target, self.layer_type, name, params, slot=slot)
                what = f"{self.layer_type} on bottom {slot} ({blob})"
            else:
                blob = target.outputs[slot]
                new = g.insert_after(target, self.layer_type, name, params, slot=slot)
                what = f"{self.layer_type} on top {slot} ({blob}; {target.name} now writes " \
                       f"{target.outputs[slot]})"
            check_loads(new)
            result.changes.append(Change(name, f"inserted {self.side} {target.name}: {what}",
                                         line=target.source_line))
            result.modified = True
        if not plan:
            result.notes.append("every target already has the layer")
        return result
