"""Inline SVG of a laid-out `Scene`: wires as smooth vertical curves through their route,
each blob labelled once below its producer, boxes with type / name / params / weights.

The markup is meant to be embedded in an HTML page, so it carries no namespace URL (an
inline `<svg>` needs none) and every text is escaped. Classes and `data-*` attributes are
what the page's style sheet and script key on: `box`, the box kind (`layer`, `output`,
`missing`, `cut`), the layer kind (`io`, `leftover`, `unknown`, `plain`), `mark-<diff
mark>`, `data-name`, `data-type`, `data-blob`.
"""

from __future__ import annotations

import math
from html import escape

from paramsurgery.view.scene import LINE_H, MAX_STUB_LABELS, PAD, Scene

Point = tuple[float, float]
TOP_RANKS = 3  # the page opens centred on the boxes of the first ranks


def render_svg(scene: Scene, *, svg_id: str = "g0", caption: str = "",
               center: int | None = None, hidden: bool = False) -> str:
    """The `<svg>` element for a scene (laid out on demand). `center`: the box the page
    opens on (`data-center`). A box with more tops than `MAX_STUB_LABELS` (a wide Split)
    sends all its wires from one port, a bus, and its long edges as one bus stub."""
    if scene.placed is None:
        scene.layout()
    placed = scene.placed
    assert placed is not None
    boxes = scene.boxes
    xs, ys = placed.x, placed.y
    out: list[str] = []
    w, h = placed.width, placed.height + (24 if caption else 0)
    top = 24.0 if caption else 0.0
    first = [i for i, r in enumerate(placed.rank) if r <= TOP_RANKS]
    top_x = sum(xs[i] for i in first) / len(first) if first else w / 2
    extra = f' data-center="{svg_id}-n{center}"' if center is not None else ""
    if hidden:
        extra += ' style="display:none"'
    out.append(f'<svg id="{svg_id}" class="graph" viewBox="0 {-int(top)} {w:.0f} {h:.0f}" '
               f'width="{w:.0f}" height="{h:.0f}" data-boxes="{len(boxes)}" '
               f'data-wires="{len(scene.wires)}" data-top-x="{top_x:.0f}"{extra}>')
    out.append('<g class="viewport">')
    if caption:
        out.append(f'<text class="caption" x="{PAD:.0f}" y="-8">{escape(caption)}</text>')
    out.append('<g class="wires">')
    labels: list[str] = []
    jumps: list[str] = []
    labelled: set[str] = set()
    buses: dict[int, list[int]] = {}  # wide box -> the boxes its long edges reach
    for wire, route in zip(scene.wires, placed.routes):
        src, dst = boxes[wire.src], boxes[wire.dst]
        bus = wire.src_slots > MAX_STUB_LABELS
        sx = xs[wire.src] if bus else \
            xs[wire.src] - src.width / 2 + src.width * (wire.src_slot + 1) / (wire.src_slots + 1)
        sy = ys[wire.src] + src.height / 2
        dx = xs[wire.dst] - dst.width / 2 + dst.width * (wire.dst_slot + 1) / (wire.dst_slots + 1)
        dy = ys[wire.dst] - dst.height / 2
        blob = escape(wire.blob, quote=True)
        label = scene.blob_labels.get(wire.blob, wire.blob)
        if not route:  # a jump: a stub under the producer, one over the consumer
            if bus:
                buses.setdefault(wire.src, []).append(wire.dst)
            jumps.append(_jump(svg_id, wire.src, wire.dst, sx, sy, dx, dy, blob, label,
                               src.name, dst.name, 10.0 * (wire.src_slot % 3),
                               10.0 * (wire.dst_slot % 3), not bus, stub_out=not bus))
            continue
        pts = [(sx, sy), *route[1:-1], (dx, dy)]
        back = dy <= sy
        cls = "wire back" if back else "wire"
        out.append(f'<path class="{cls}" data-blob="{blob}" d="{_curve(pts)}">'
                   f'<title>{escape(label)}</title></path>')
        if bus:
            buses.setdefault(wire.src, [])
        elif wire.blob not in labelled:
            labelled.add(wire.blob)
            labels.append(f'<text class="blob" x="{sx + 3:.1f}" y="{sy + 11:.1f}" '
                          f'data-blob="{blob}">{escape(label)}</text>')
    for b, far in buses.items():
        out.append(_bus(svg_id, b, boxes[b], xs[b], ys[b] + boxes[b].height / 2, far, boxes))
    out.append("</g>")
    out.append('<g class="jumps">')
    out.extend(jumps)
    out.append("</g>")
    out.append('<g class="labels">')
    out.extend(labels)
    out.append("</g>")
    out.append('<g class="boxes">')
    scale = value_scale(scene)
    for i, box in enumerate(boxes):
        bw, bh = box.width, box.height
        x0, y0 = xs[i] - bw / 2, ys[i] - bh / 2
        cls = f"box {box.kind} {box.css}" + (f" mark-{box.mark}" if box.mark else "")
        extra = ""
        if box.layer_id is not None:
            extra = f' data-type="{escape(box.lines[0], quote=True)}"'
        if box.value is not None:
            extra += f' data-value="{box.value:.6g}"'
            if box.over is not None:
                extra += f' data-over="{int(box.over)}"'
        if box.expand:
            extra += f' data-expand="{escape(box.expand, quote=True)}"'
        fill = (f' style="fill:{value_colour(box.value, scale, scene.threshold, box.over)}"'
                if box.value is not None else "")
        out.append(f'<g id="{svg_id}-n{i}" class="{cls}" data-name="{escape(box.name, quote=True)}"'
                   f'{extra} transform="translate({x0:.1f},{y0:.1f})">'
                   f'<title>{escape(box.title)}</title>'
                   f'<rect width="{bw:.1f}" height="{bh:.1f}" rx="{4 if box.kind == "layer" else 9}"'
                   f'{fill}/>')
        for j, line in enumerate(box.lines):
            cls = box.line_classes[j] if j < len(box.line_classes) else "type"
            out.append(f'<text class="{cls}" x="{PAD:.0f}" '
                       f'y="{PAD / 2 + LINE_H * (j + 1) - 3:.0f}">{escape(line)}</text>')
        out.append("</g>")
    out.append("</g></g></svg>")
    return "\n".join(out)


def _bus(svg_id: str, b: int, box, x: float, y: float, far: list[int], boxes) -> str:
    """The tops of a wide box (a Split read by every block) as one bus: a bar under the
    box, its routed wires leaving from the middle, one stub for all its long edges."""
    w = box.width
    n = len(far)
    first = f' data-to="{svg_id}-n{far[0]}"' if far else ""
    tip = (f"{box.name}: {n} of its reads go far down the graph (" +
           ", ".join(boxes[d].name for d in far[:8]) + (", ..." if n > 8 else "") +
           "): click to go to the first" if far else f"{box.name}: its tops")
    return (f'<g class="bus"{first}><title>{escape(tip)}</title>'
            f'<path class="wire bus" d="M{x - w / 2 + 4:.1f},{y + 3:.1f}h{w - 8:.1f}"/>'
            + (f'<path class="wire bus" d="M{x:.1f},{y + 3:.1f}v22"/>'
               f'<text class="jump" x="{x + 4:.1f}" y="{y + 22:.1f}">⇉ {n} far reads</text>'
               if far else "") + "</g>")


def _jump(svg_id: str, src: int, dst: int, sx: float, sy: float, dx: float, dy: float,
          blob: str, label: str, src_name: str, dst_name: str, stagger: float,
          stagger_in: float, out_label: bool, *, stub_out: bool = True) -> str:
    """A long edge as two stubs; clicking one end shows the other (data-to). Labels of
    neighbouring tops are staggered so they do not overprint. Without `stub_out` (a bus
    draws the producer's end) only the consumer's stub."""
    return (f'<g class="jump" data-blob="{blob}">'
            + (f'<g class="jump-out" data-to="{svg_id}-n{dst}"><title>{escape(label)} to '
               f'{escape(dst_name)} (click to go there)</title>'
               f'<path class="wire jump" d="M{sx:.1f},{sy:.1f}v{18 + stagger:.0f}"/>'
               + (f'<text class="jump" x="{sx + 3:.1f}" y="{sy + 24 + stagger:.1f}">→ '
                  f'{escape(dst_name)}</text>' if out_label else "") + "</g>"
               if stub_out else "") +
            f'<g class="jump-in" data-to="{svg_id}-n{src}"><title>{escape(label)} from '
            f'{escape(src_name)} (click to go there)</title>'
            f'<path class="wire jump" d="M{dx:.1f},{dy - 18 - stagger_in:.1f}'
            f'v{18 + stagger_in:.0f}"/>'
            f'<text class="jump" x="{dx + 3:.1f}" y="{dy - 20 - stagger_in:.1f}">{escape(label)} ← '
            f'{escape(src_name)}</text></g></g>')


def _curve(pts: list[Point]) -> str:
    """A path through the points, each step a cubic with vertical tangents."""
    (x0, y0) = pts[0]
    d = [f"M{x0:.1f},{y0:.1f}"]
    for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
        my = (yb - ya) / 2
        if abs(my) < 1:
            my = 20.0
        d.append(f"C{xa:.1f},{ya + my:.1f} {xb:.1f},{yb - my:.1f} {xb:.1f},{yb:.1f}")
    return "".join(d)


def value_scale(scene: Scene) -> tuple[float, float] | None:
    """log10 of the smallest and largest positive value drawn, None when there is none."""
    vals = [b.value for b in scene.boxes if b.value is not None and b.value > 0]
    if not vals:
        return None
    return math.log10(min(vals)), math.log10(max(vals))


def value_colour(value: float | None, scale: tuple[float, float] | None,
                 threshold: float | None = None, over: bool | None = None) -> str:
    """Green (smallest) to red (largest) on a log scale. With a `threshold` (a tolerance)
    it is the colour break: a value within it (`over` False) is green, lighter the smaller;
    one over it yellow (just over) to red (the largest value drawn), never green."""
    if value is None:
        return "#fff"
    if threshold is not None and threshold > 0:
        hi = max(scale[1] if scale else 0.0, math.log10(threshold) + 1.0)
        lt = math.log10(threshold)
        if not over:
            lo = min(scale[0] if scale else lt, lt - 3.0)
            t = 0.0 if value <= 0 else max(0.0, min(1.0, (math.log10(value) - lo) / (lt - lo)))
            return f"hsl(130,{45 + 20 * t:.0f}%,{88 - 10 * t:.0f}%)"
        t = 0.0 if value <= threshold else min(1.0, (math.log10(value) - lt) / (hi - lt))
        return f"hsl({50 * (1 - t):.0f},90%,{72 - 12 * t:.0f}%)"
    if scale is None or value <= 0:
        return "hsl(120,60%,85%)"
    lo, hi = scale
    t = 0.0 if hi <= lo else (math.log10(value) - lo) / (hi - lo)
    return f"hsl({120 * (1 - t):.0f},70%,{82 - 12 * t:.0f}%)"
