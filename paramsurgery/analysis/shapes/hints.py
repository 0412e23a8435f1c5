"""ncnnoptimize's `-23330` shape hints: param 30, an int array of `dims, w, h, c` per top
(`-23330=4,3,56,56,64`; two tops: `-23330=8,...`), written right after the blob names.
ncnn reads them into `Layer::top_shapes`; a 4-D blob's `d` is not in the hint."""

from __future__ import annotations

from collections.abc import Sequence

from paramsurgery.ir.layer import Layer
from paramsurgery.analysis.shapes.shapemap import Shape

HINT_PID = 30


def read_hints(layer: Layer) -> list[Shape | None] | None:
    """Per top: the hinted shape in numpy order (`d` of a 4-D blob is None), None for a top
    whose hint says dims 0; None when the layer has no (well-formed) hint."""
    p = layer.params
    if not p.may_hold(HINT_PID):
        return None  # cheap test on the raw text: no parse for unhinted layers
    v = p.get(HINT_PID)
    if not isinstance(v, list) or len(v) % 4 or not v:
        return None
    out: list[Shape | None] = []
    for i in range(0, len(v), 4):
        dims, w, h, c = v[i:i + 4]
        if dims == 1:
            out.append((w,))
        elif dims == 2:
            out.append((h, w))
        elif dims == 3:
            out.append((c, h, w))
        elif dims == 4:
            out.append((c, None, h, w))
        else:
            out.append(None)
    return out


def hint_values(shapes: Sequence[Shape | None]) -> list[int] | None:
    """The `-23330` array for these top shapes (every dim an int), None if one is not."""
    vals: list[int] = []
    for s in shapes:
        if s is None or not 1 <= len(s) <= 4 or \
                any(not isinstance(d, int) for i, d in enumerate(s) if not (len(s) == 4 and i == 1)):
            return None
        if len(s) == 1:
            vals += [1, s[0], 1, 1]
        elif len(s) == 2:
            vals += [2, s[1], s[0], 1]
        elif len(s) == 3:
            vals += [3, s[2], s[1], s[0]]
        else:
            vals += [4, s[3], s[2], s[0]]
    return vals


def set_hint(layer: Layer, shapes: Sequence[Shape | None]) -> bool:
    """Write (or refresh) the layer's hint, placed first as ncnnoptimize writes it; removes
    the hint when a shape is not fully known. Returns whether the layer changed."""
    vals = hint_values(shapes)
    before = layer.params.get(HINT_PID)
    if vals is None:
        if before is None:
            return False
        layer.unset(HINT_PID)
        return True
    if before == vals:
        return False
    layer.set(HINT_PID, vals)
    layer.params.move_first(HINT_PID)
    return True


def strip_hints(layer: Layer) -> bool:
    if layer.params.get(HINT_PID) is None:
        return False
    layer.unset(HINT_PID)
    return True


def has_hints(g) -> bool:
    for layer in g:
        p = layer.params
        if p.may_hold(HINT_PID) and p.get(HINT_PID) is not None:
            return True
    return False


def write_hints(g, shapes) -> int:
    """Set every layer's `-23330` hint from `shapes` (a layer whose tops are not all known
    gets none, as ncnnoptimize does). Returns how many layers changed."""
    changed = 0
    for layer in g:
        tops = [shapes.known(b) for b in layer.outputs]
        if not layer.outputs:
            continue
        if all(t is not None for t in tops):
            changed += set_hint(layer, tops)
        else:
            changed += strip_hints(layer)
    return changed


def snapshot(g) -> dict[int, str] | None:
    """What `refresh_after` compares against: each layer's line, for hinted graphs only
    (None = the graph has no hints, nothing to keep fresh)."""
    if not has_hints(g):
        return None
    return {layer.id: layer.render() for layer in g}


