"""What is drawn for a graph: one box per layer, one wire per blob read, and small pills
where a blob leaves the picture (a graph output), has no producer (a dangling read) or
crosses the edge of an `--around` neighbourhood. Pure data; `layout` places it and
`svg` draws it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.view.labels import clip, layer_info, layer_kind, layer_lines
from paramsurgery.view.layout import Placed, layered_layout

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer

CHAR_W = 6.6  # width of one character of the 11px monospace box font
LINE_H = 14.0
PAD = 7.0
MIN_W = 64.0
LABEL_CHAR_W = 6.2  # width of one character of the 9px blob labels, plus spacing
MAX_STUB_LABELS = 6  # a box with more tops than this is not widened for their labels, and
# its long-edge stubs are labelled in their tooltips only (56 rope-table reads would overprint)

LAYER, OUTPUT, MISSING, CUT, HUB = "layer", "output", "missing", "cut", "hub"
MAX_LAYERS = 5000  # more boxes than this make an unreadable page: draw a part
HUB_READERS = 8  # a layer whose tops are read by more layers than this is a hub (the kv-cache
# Input, the Splits of the mask and rope tables every block reads): `--around` stops there


@dataclass
class Box:
    """One drawn node: a layer, or a pill for a blob at the border of the picture."""

    kind: str  # LAYER | OUTPUT | MISSING | CUT
    name: str  # the layer name, or the blob name for a pill
    lines: list[str]
    title: str
    css: str  # layer_kind() for layers; the pill kind otherwise
    layer_id: int | None = None
    mark: str = ""  # a diff mark (added, removed, changed, renamed) or '' for none
    value: float | None = None  # a per-layer value drawn as the fill (compare --html)
    line_classes: list[str] = field(default_factory=list)  # css class per line
    info: dict | None = None  # what the side panel shows on a click (labels.layer_info)
    over: bool | None = None  # the value is out of tolerance (None: no tolerance given)
    expand: str = ""  # a group box: the element id a click on it opens (overview)

    port_width: float = 0.0  # room the blob labels under the box need

    @property
    def width(self) -> float:
        return max(MIN_W, self.port_width, max(len(t) for t in self.lines) * CHAR_W + 2 * PAD)

    @property
    def height(self) -> float:
        return len(self.lines) * LINE_H + PAD


@dataclass
class Wire:
    """One blob read: producer box top slot → consumer box bottom slot."""

    src: int
    dst: int
    blob: str
    src_slot: int
    src_slots: int
    dst_slot: int
    dst_slots: int


@dataclass
class Scene:
    boxes: list[Box] = field(default_factory=list)
    wires: list[Wire] = field(default_factory=list)
    blob_labels: dict[str, str] = field(default_factory=dict)  # blob -> label text
    placed: Placed | None = None
    threshold: float | None = None  # the values' tolerance: the colour break

    def layout(self) -> "Scene":
        self.placed = layered_layout([b.width for b in self.boxes],
                                     [b.height for b in self.boxes],
                                     [(w.src, w.dst) for w in self.wires])
        return self

    def box_of_layer(self) -> dict[str, int]:
        """Layer name → box index (the first box of that name)."""
        out: dict[str, int] = {}
        for i, b in enumerate(self.boxes):
            if b.kind == LAYER:
                out.setdefault(b.name, i)
        return out


def build_scene(graph: "Graph", *, layers: Iterable[int] | None = None,
                shapes: dict[str, str] | None = None, hubs: Iterable[int] = ()) -> Scene:
    """The boxes and wires of `graph` (or of the layers with ids in `layers`), in file
    order, pills placed next to the box they belong to so the order stays topological.
    A layer of `hubs` left out of `layers` is drawn as one pill (a hub stub) however many
    of its tops the drawn layers read."""
    shapes = shapes or {}
    keep = None if layers is None else set(layers)
    hub_set = set(hubs)
    scene = Scene()
    boxes, wires = scene.boxes, scene.wires
    box_of: dict[int, int] = {}  # layer id -> box index
    pill_in: dict[str, int] = {}  # blob -> box index of its missing / cut pill
    hub_pill: dict[int, int] = {}  # hub layer id -> box index of its pill
    for layer in graph:
        if keep is not None and layer.id not in keep:
            continue
        n_in = len(layer.inputs)
        ins: list[tuple[int, int, int, str]] = []  # (src box, src slot, src slots, blob)
        for blob in layer.inputs:
            ps = graph.producer_slot(blob)
            if ps is not None and ps[0].id in box_of:
                prod, slot = ps
                ins.append((box_of[prod.id], slot, len(prod.outputs), blob))
                continue
            if ps is not None and ps[0].id in hub_set and keep is not None \
                    and ps[0].id not in keep:
                hub = ps[0]
                if hub.id not in hub_pill:
                    hub_pill[hub.id] = len(boxes)
                    n = hub_readers(graph, hub)
                    boxes.append(Box(HUB, hub.name, [f"hub {hub.type} {hub.name}",
                                                     f"{len(hub.outputs)} tops, {n} readers"],
                                     f"{hub.type} {hub.name}: {len(hub.outputs)} tops read by "
                                     f"{n} layers (not drawn: --expand-hubs draws through it)",
                                     HUB, line_classes=["type", "params"],
                                     info=layer_info(hub, shapes)))
                ins.append((hub_pill[hub.id], 0, 1, blob))
                continue
            if blob not in pill_in:
                later = ps is not None and (keep is None or ps[0].id in keep)
                kind = MISSING if ps is None or later else CUT
                if ps is None:
                    text, title = f"no producer: {blob}", f"blob {blob} is read but nothing " \
                                                          f"writes it"
                elif later:
                    text, title = f"written later: {blob}", (
                        f"blob {blob} is written by {ps[0].type} {ps[0].name}, after this layer "
                        f"in the file (ncnn needs the layers in topological order)")
                else:
                    text, title = f"… {blob}", (f"blob {blob} from {ps[0].type} {ps[0].name} "
                                                f"(outside the view)")
                pill_in[blob] = len(boxes)
                boxes.append(Box(kind, blob, [clip(_with_shape(text, blob, shapes))], title,
                                 kind))
            ins.append((pill_in[blob], 0, 1, blob))
        me = add_layer(scene, box_of, layer, shapes, ins, n_in)
        for blob in layer.outputs:
            if blob not in scene.blob_labels:
                scene.blob_labels[blob] = _with_shape(blob, blob, shapes)
        if 1 < len(layer.outputs) <= MAX_STUB_LABELS:  # labels side by side: make room
            boxes[me].port_width = (len(layer.outputs) + 1) * max(
                len(scene.blob_labels[b]) for b in layer.outputs) * LABEL_CHAR_W
        for slot, blob in enumerate(layer.outputs):
            readers = graph.consumer_layers(blob)
            if readers and (keep is None or any(r.id in keep for r in readers)):
                continue
            kind = OUTPUT if not readers else CUT
            to_hub = next((r for r in readers if r.id in hub_set), None)
            text = (f"output {blob}" if kind == OUTPUT else
                    f"{blob} → hub {to_hub.name}" if to_hub is not None else f"{blob} …")
            title = (f"graph output {blob}" if kind == OUTPUT else
                     f"blob {blob}, read by {', '.join(r.name for r in readers[:5])} "
                     f"(outside the view" + (f"; {to_hub.type} {to_hub.name} is a hub read by "
                                             f"{hub_readers(graph, to_hub)} layers)"
                                             if to_hub is not None else ")"))
            pill = len(boxes)
            boxes.append(Box(kind, blob, [clip(_with_shape(text, blob, shapes))], title,
                             "io" if kind == OUTPUT else kind))
            wires.append(Wire(me, pill, blob, slot, len(layer.outputs), 0, 1))
    for blob in pill_in:
        scene.blob_labels.setdefault(blob, _with_shape(blob, blob, shapes))
    return scene


def add_layer(scene: Scene, box_of: dict[int, int], layer: "Layer", shapes: dict[str, str],
              ins: list[tuple[int, int, int, str]], n_in: int) -> int:
    """Add `layer`'s box to `scene` (recorded in `box_of`) wired from `ins`, one
    (source box, source slot, source slots, blob) per input slot; its box index."""
    me = len(scene.boxes)
    box_of[layer.id] = me
    scene.boxes.append(layer_box(layer, shapes))
    for dst_slot, (src, src_slot, src_slots, blob) in enumerate(ins):
        scene.wires.append(Wire(src, me, blob, src_slot, src_slots, dst_slot, n_in))
    return me


def layer_box(layer: "Layer", shapes: dict[str, str]) -> Box:
    """The box of a layer: its lines, tooltip, kind and side-panel data."""
    lines, classes, title = layer_lines(layer)
    return Box(LAYER, layer.name, lines, title, layer_kind(layer.type), layer_id=layer.id,
               line_classes=classes, info=layer_info(layer, shapes))


def _with_shape(text: str, blob: str, shapes: dict[str, str]) -> str:
    s = shapes.get(blob)
    return f"{text} {s}" if s else text


def hub_readers(graph: "Graph", layer: "Layer") -> int:
    """How many layers read the tops of `layer`."""
    return len({r.id for blob in layer.outputs for r in graph.consumer_layers(blob)})


def hub_layers(graph: "Graph", readers: int = HUB_READERS) -> set[int]:
    """Ids of the layers whose tops more than `readers` layers read: the kv-cache Input
    with a top per block, the Splits of the attention mask and the rope tables."""
    if readers <= 0:
        return set()
    return {lay.id for lay in graph if hub_readers(graph, lay) > readers}


def neighbourhood(graph: "Graph", center: str, depth: int, *,
                  hubs: Iterable[int] = ()) -> set[int]:
    """Ids of the layers within `depth` blob hops of layer (or blob) `center`, both ways,
    not passing through the layers of `hubs` (they are not drawn, except `center` itself)."""
    if depth < 0:
        raise ParamSurgeryError(f"--depth {depth}: give a number >= 0")
    start = graph.find(center)
    if start is None:
        producer = graph.producer(center)
        if producer is None:
            raise ParamSurgeryError(f"--around {center!r}: no layer or blob of that name")
        start = producer
    return around_layers(graph, [start.id], depth, stop=hubs)


def around_layers(graph: "Graph", start: Iterable[int], depth: int, *,
                  stop: Iterable[int] = ()) -> set[int]:
    """Ids of the layers within `depth` blob hops of any layer in `start` (breadth first,
    both directions), never entering a layer of `stop`."""
    seen = dict.fromkeys(start, 0)
    blocked = set(stop) - set(seen)
    todo = deque(graph.layer(i) for i in seen)
    while todo:
        layer = todo.popleft()
        d = seen[layer.id]
        if d == depth:
            continue
        for nb in (*graph.predecessors(layer), *graph.successors(layer)):
            if nb.id not in seen and nb.id not in blocked:
                seen[nb.id] = d + 1
                todo.append(nb)
    return set(seen)
