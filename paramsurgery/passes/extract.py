"""Cut a subgraph out of a graph, with exactly its weights (`paramsurgery extract`).

    sub = extract_subgraph(g, inputs=["52"], outputs=["out0"])    # e.g. an lm_head
    save(sub, "head.param", bin="head.bin")                         # only its weights

The subgraph holds the layers that compute `outputs` from `inputs` and nothing else, in the
original file order. A cut blob (an intermediate blob named in `inputs`) becomes the top of a
new `Input` layer of the same name; a graph input named in `inputs` keeps its `Input` layer
(trimmed to the requested tops when it had several). Every kept layer keeps its params, its
line text and its weights (`layer.weights` objects are shared, so their bytes are the same
bytes: `weights_fingerprint` of a kept layer is unchanged, and `save(..., bin=...)` streams
them from the source `.bin`).

Refusals (`PassRefused`, with the reason): an output or input that is not a blob; an output
that is also an input; an output that depends on a graph input not listed in `inputs` (it
would be unfed); an input no output depends on (including one cut off by another input).

Tops of kept layers that the subgraph does not read: a `Split` loses them (a `Split` left
with one top is removed); any other layer keeps them, and they become extra outputs of the
subgraph (as ncnn defines outputs), which the result reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.analysis.validate import validate

if TYPE_CHECKING:
    from paramsurgery.runtime.child import FeedLike


@dataclass
class ExtractPlan:
    """What `plan_extract` decided: kept layers (ids in the source graph), where each
    input comes from, and which graph inputs the outputs need."""

    keep: set[int] = field(default_factory=set)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)  # inputs that were intermediate blobs
    graph_inputs: list[str] = field(default_factory=list)  # inputs that were Input tops


def _split_names(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [v for v in (p.strip() for p in value.split(",")) if v]
    return [str(v) for v in value]


def _natural(name: str) -> tuple:
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def plan_extract(g: Graph, inputs: Sequence[str] | None, outputs: Sequence[str]) -> ExtractPlan:
    """Decide the subgraph without editing anything. `inputs=None` means "the graph inputs
    the outputs depend on" (no cut)."""
    outputs = list(dict.fromkeys(outputs))
    if not outputs:
        raise PassRefused("no outputs given")
    auto_inputs = inputs is None
    inputs = [] if inputs is None else list(dict.fromkeys(inputs))
    where = g.source.path
    for b in outputs:
        if not g.has_blob(b):
            raise PassRefused(f"output {b!r}: no blob of that name", file=where)
        if g.producer(b) is None:
            raise PassRefused(f"output {b!r}: no layer writes it", file=where)
    for b in inputs:
        if not g.has_blob(b):
            raise PassRefused(f"input {b!r}: no blob of that name", file=where)
        if g.producer(b) is None:
            raise PassRefused(f"input {b!r}: no layer writes it (a dangling blob cannot be "
                              f"a subgraph input)", file=where)
    both = [b for b in outputs if b in inputs]
    if both:
        raise PassRefused(f"{', '.join(both)} named as both input and output", file=where)

    from paramsurgery.ir.cone import cone

    input_set = set(inputs)
    keep: set[int] = set()
    used_inputs: set[str] = set()
    unfed: dict[str, list[str]] = {}  # graph input -> outputs that need it
    by_id, pos = g.nx.nodes, g.position()
    for out in outputs:
        sink = g.producer(out)
        assert sink is not None  # checked above
        for lid in sorted(cone(g, [sink.id], stop=input_set), key=pos.__getitem__):
            layer = by_id[lid]["layer"]
            if layer.type == "Input":
                if auto_inputs:
                    used_inputs.update(layer.outputs)
                    inputs.extend(b for b in layer.outputs if b not in input_set)
                    input_set.update(layer.outputs)
                else:
                    for b in layer.outputs:
                        unfed.setdefault(b, []).append(out)
                continue
            keep.add(layer.id)
            for b in layer.inputs:
                if b in input_set:
                    used_inputs.add(b)
                elif g.producer(b) is None:
                    raise PassRefused(f"output {out!r} depends on blob {b!r}, which no layer "
                                      f"writes", file=where)
    if unfed:
        by_outs: dict[tuple[str, ...], list[str]] = {}
        for b, outs in unfed.items():
            by_outs.setdefault(tuple(outs), []).append(b)
        parts = []
        for needing, bs in by_outs.items():
            bs = sorted(bs, key=_natural)
            parts.append(f"{', '.join(needing)} depend{'s' if len(needing) == 1 else ''} on "
                         f"graph input{'s' if len(bs) > 1 else ''} {', '.join(bs)}")
        n = len(unfed)
        raise PassRefused(f"{'; '.join(parts)}, which {'is' if n == 1 else 'are'} not in the "
                          f"inputs (add {'it' if n == 1 else 'them'} to the inputs, or also cut a "
                          f"blob between {'it' if n == 1 else 'them'} and the outputs)",
                          file=where)
    unused = [b for b in inputs if b not in used_inputs]
    if unused:
        raise PassRefused(f"input(s) {', '.join(unused)}: no output depends on them (not "
                          f"upstream of {', '.join(outputs)}, or cut off by another input)",
                          file=where)
    if auto_inputs:  # the graph's own input order
        order = {b: i for i, b in enumerate(g.inputs)}
        inputs.sort(key=lambda b: order.get(b, len(order)))
    plan = ExtractPlan(keep, inputs, outputs)
    for b in inputs:
        p = g.producer(b)
        (plan.graph_inputs if p is not None and p.type == "Input" else plan.cut).append(b)
    return plan


def extract_subgraph(graph: Graph, inputs: Sequence[str] | None,
                     outputs: Sequence[str]) -> Graph:
    """The subgraph that computes `outputs` from `inputs`, with exactly its layers and
    weights (see the module docstring). The input graph is not modified."""
    return Extract(inputs, outputs)(graph).graph


def inputs_for_cut(g: Graph, blobs: Sequence[str], *, name: Callable[[str], str] = str,
                   params: Callable[[str], Any] = lambda blob: None) -> list[Layer]:
    """The cut shared by `extract` and `reduce`: each blob (now read, no longer written)
    becomes the top of a new `Input` layer, at the top of the graph, in the order given."""
    added: list[Layer] = []
    anchor = next(iter(g), None)
    for b in blobs:
        layer_name = g.unique_layer_name(name(b))
        if anchor is None:
            added.append(g.add_layer("Input", layer_name, [], [b], params(b)))
        else:
            added.append(g.add_layer("Input", layer_name, [], [b], params(b), before=anchor))
    return added


class Extract(Pass, name="extract",
              summary="cut the subgraph computing some blobs from others, with exactly its weights"):
    inputs: Sequence[str] | None  # or "a,b"; None: the graph's own inputs
    outputs: Sequence[str]  # or "a,b"

    def __post_init__(self) -> None:
        inputs = _split_names(self.inputs)
        object.__setattr__(self, "inputs", tuple(inputs) if inputs is not None else None)
        object.__setattr__(self, "outputs", tuple(_split_names(self.outputs) or ()))

    def __call__(self, g: Graph, *, in_place: bool = False) -> PassResult:
        from paramsurgery.core.collector import paused_gc

        # the plan is made on the caller's graph (layer ids), the edit on a copy whose ids
        # are renumbered in file order: map through positions. The collector is paused as
        # in `Pass.__call__`: the plan builds `g.nx` (a few dicts per layer) and the edit
        # allocates per layer, and full collections would rescan the graph each time
        with paused_gc():
            plan = plan_extract(g, self.inputs, self.outputs)
            pos = g.position()
            keep_pos = {pos[i] for i in plan.keep}
            before = validate(g)
            work = g if in_place else g.copy()
            result = self._apply(work, keep_pos, plan, len(g))
            result.graph = work
            result.pass_name = self.name
            self.ensures(work, before)
            return result

    def run(self, g: Graph) -> PassResult:
        """Extract in place (no copy; `__call__` works on a copy)."""
        plan = plan_extract(g, self.inputs, self.outputs)
        pos = g.position()
        return self._apply(g, {pos[i] for i in plan.keep}, plan, len(g))

    # ------------------------------------------------------------------ the edit
    def _apply(self, g: Graph, keep_pos: set[int], plan: ExtractPlan, total: int) -> PassResult:
        result = PassResult(g, True)
        layers = g.layers
        input_set = set(plan.inputs)
        graph_inputs = set(plan.graph_inputs)
        dropped = 0
        for i, layer in enumerate(layers):
            if i in keep_pos:
                continue
            if layer.type == "Input" and any(b in graph_inputs for b in layer.outputs):
                continue  # kept, trimmed below
            g.remove_layer(layer)
            dropped += 1
        # Input layers of requested graph inputs: only the requested tops
        for layer in g.by_type("Input"):
            tops = [b for b in layer.outputs if b in graph_inputs]
            if list(layer.outputs) != tops:
                result.changes.append(Change(layer.name, "Input tops", len(layer.outputs),
                                             len(tops), layer.source_line))
                g.set_outputs(layer, tops)
        # kept layers that also write an input blob: the new Input takes the name
        for layer in list(g):
            if layer.type == "Input":
                continue
            for b in [t for t in layer.outputs if t in input_set]:
                if layer.type == "Split":
                    g.set_outputs(layer, [t for t in layer.outputs if t != b])
                else:
                    new = g.unique_blob_name(f"{b}_unused")
                    tops = [new if t == b else t for t in layer.outputs]
                    g.set_outputs(layer, tops)
                    result.notes.append(f"{layer.name} also writes input {b!r}: that top is "
                                        f"renamed {new!r} in the subgraph")
        # unread tops: Splits lose them, other layers keep them (extra outputs)
        wanted = set(plan.outputs)
        for layer in list(g):
            if layer.type == "Input" or layer.graph is None:
                continue
            unread = [t for t in layer.outputs if t not in wanted and not g.consumers(t)]
            if not unread:
                continue
            if layer.type == "Split":
                tops = [t for t in layer.outputs if t not in unread]
                g.set_outputs(layer, tops)
                if len(tops) == 1 and len(layer.inputs) == 1:
                    g.bypass(layer)
                    result.changes.append(Change(layer.name, "Split with one reader removed"))
                else:
                    result.changes.append(Change(layer.name, "Split tops", len(tops) +
                                                 len(unread), len(tops), layer.source_line))
            else:
                result.notes.append(f"{layer.name} ({layer.type}) also writes "
                                    f"{', '.join(unread)}, which the subgraph does not read: "
                                    f"extra output(s)")
        # cut blobs become Input layers, at the top, in the order given
        for layer in inputs_for_cut(g, plan.cut):
            result.changes.append(Change(layer.name, f"Input for cut blob {layer.outputs[0]!r}"))
        kept = len(g)
        result.changes.insert(0, Change("graph", "layers", total, kept))
        result.data.update(inputs=list(plan.inputs), outputs=list(plan.outputs),
                           cut=list(plan.cut), graph_inputs=list(plan.graph_inputs),
                           dropped=dropped, extra_outputs=[b for b in g.outputs
                                                           if b not in wanted])
        if g.weights is not None or any(l.weights is not None for l in g):
            nbytes = sum(l.weights.nbytes for l in g if l.weights is not None)
            result.data["weight_bytes"] = nbytes
        return result


# ---------------------------------------------------------------------- proof through ncnn

@dataclass
class ExtractCheck:
    """Blob-for-blob comparison of a subgraph against the full graph (through ncnn)."""

    blobs: dict[str, float] = field(default_factory=dict)  # output -> max |Δ|
    shapes: dict[str, tuple] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return all(v == 0.0 for v in self.blobs.values())

    @property
    def ok(self) -> bool:  # the runner's verdict: bit-identical
        return self.exact

    def format(self) -> str:
        lines = ["extract check: subgraph vs full graph, same inputs, through ncnn"]
        for b, d in self.blobs.items():
            lines.append(f"  {b:<24} shape {self.shapes.get(b)}  max|Δ| {d:.3e}  "
                         f"{'identical' if d == 0.0 else 'DIFFERS'}")
        lines.append("  result: " + ("bit-identical" if self.exact else "DIFFERENT"))
        return "\n".join(lines)


def check_extract(full_param: str, full_bin: str | None, sub_param: str, sub_bin: str | None,
                  feeds: "Mapping[str, FeedLike]", outputs: Iterable[str],
                  cut: Iterable[str] = ()) -> ExtractCheck:
    """Run the full graph on `feeds` (graph inputs), take the `cut` blobs it computes as the
    subgraph's inputs (their values unchanged), run the subgraph, and compare `outputs` with
    the full graph's. Each graph runs in its own child process, one after the other, and only
    the cut blobs and the outputs come back: the two graphs' weights are never resident at
    once (both in this process was twice the weights for a cut through the middle)."""
    import numpy as np

    from paramsurgery.runtime.child import run_isolated

    outputs = list(outputs)
    cut = list(cut)
    full = run_isolated(full_param, full_bin, feeds, list(dict.fromkeys(cut + outputs)))
    if not full.ok:
        raise PassRefused(f"the full graph cannot compute {', '.join(cut + outputs)}: "
                          f"{full.describe()}")
    sub_names = _input_names(sub_param)
    sub_inputs = {**{name: v for name, v in feeds.items() if name in sub_names},
                  **{b: full.outputs[b] for b in cut}}
    sub = run_isolated(sub_param, sub_bin, sub_inputs, outputs)
    if not sub.ok:
        raise PassRefused(f"the subgraph cannot compute {', '.join(outputs)}: {sub.describe()}")
    check = ExtractCheck()
    for b in outputs:
        got, want = sub.outputs[b], full.outputs[b]
        check.shapes[b] = tuple(want.shape)
        if got.shape != want.shape:
            check.blobs[b] = float("inf")
        else:
            check.blobs[b] = float(np.max(np.abs(got.astype(np.float64) -
                                                 want.astype(np.float64)))) if got.size else 0.0
    return check


def _input_names(param: str) -> set[str]:
    from paramsurgery.formats.io import load

    return set(load(param).inputs)
