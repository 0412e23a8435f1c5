"""One self-contained HTML page: inline SVG panes, a style sheet and a few lines of plain
JavaScript written here (pan by dragging, zoom with the wheel, search by layer name, type or
blob, click a jump stub to go to its other end). No network fetch, no external URL: the page
opens offline and from an email attachment.

`#search=NAME` (or `?search=NAME`) in the page's URL runs a search on load; the result is in
`#status` and in `data-hits` / `data-first` of `<body>`, which is how the browser test reads
it. `#whole` opens on the whole graph instead of its readable top.

Builders: `graph_page` (view), `diff_page` (diff --html, --report), `values_page` (a value
per layer along the graph: compare's error per layer), and `render_page` for any panes.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Mapping, Sequence

from paramsurgery.view.labels import blob_shapes
from paramsurgery.view.scene import MAX_LAYERS, Scene, around_layers, build_scene
from paramsurgery.view.svg import render_svg

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.view.diff import GraphDiff

CONTEXT = 3  # hops drawn around each change when a diff's graphs are too large to draw

LEGEND = {
    "io": "Input / output",
    "leftover": "not converted (pnnx leftover)",
    "unknown": "not an ncnn type",
    "missing": "blob nobody writes",
    "cut": "outside the view",
    "mark-added": "added",
    "mark-removed": "removed",
    "mark-changed": "changed",
    "mark-renamed": "renamed",
}

STYLE = """
body{margin:0;font:13px system-ui,sans-serif;color:#222;display:flex;flex-direction:column;height:100vh}
header{padding:6px 10px;border-bottom:1px solid #ccc;display:flex;gap:10px;align-items:center;flex-wrap:wrap}
header input{font:inherit;padding:2px 6px;width:18em}
#status{color:#555;min-width:10em}
.legend span{display:inline-block;margin-right:8px}
.legend i{display:inline-block;width:12px;height:10px;border:1px solid #555;margin-right:3px;vertical-align:-1px}
details{padding:2px 10px;border-bottom:1px solid #eee}
details pre{max-height:30vh;overflow:auto;margin:4px 0;font:12px ui-monospace,Menlo,Consolas,monospace}
main{flex:1;display:flex;min-height:0}
.pane{flex:1;display:flex;flex-direction:column;min-width:0;border-right:1px solid #ccc}
.pane h2{font-size:13px;margin:0;padding:3px 8px;background:#f4f4f4;overflow:hidden;white-space:nowrap;text-overflow:ellipsis}
.canvas{flex:1;min-height:0;cursor:grab}
.canvas svg{width:100%;height:100%;display:block;user-select:none}
svg text{font:11px ui-monospace,Menlo,Consolas,monospace}
.box rect{fill:#fff;stroke:#666;stroke-width:1}
.box .type{font-weight:bold}
.box .params{fill:#555}
.box .weights{fill:#0a6}
.box .value{font-weight:bold;fill:#000}
.box.io rect,.legend .io{fill:#dbeafe;background:#dbeafe;stroke:#1d4ed8}
.box.leftover rect,.legend .leftover{fill:#fecaca;background:#fecaca;stroke:#b91c1c;stroke-width:2}
.box.unknown rect,.legend .unknown{fill:#ffedd5;background:#ffedd5;stroke:#c2410c;stroke-dasharray:4 2}
.box.missing rect,.legend .missing{fill:#fca5a5;background:#fca5a5;stroke:#b91c1c}
.box.cut rect,.legend .cut{fill:#f3f4f6;background:#f3f4f6;stroke:#9ca3af;stroke-dasharray:3 2}
.box.mark-added rect,.legend .mark-added{fill:#bbf7d0;background:#bbf7d0;stroke:#15803d;stroke-width:3}
.box.mark-removed rect,.legend .mark-removed{fill:#fecaca;background:#fecaca;stroke:#b91c1c;stroke-width:3}
.box.mark-changed rect,.legend .mark-changed{fill:#fef08a;background:#fef08a;stroke:#a16207;stroke-width:3}
.box.mark-renamed rect,.legend .mark-renamed{fill:#c7d2fe;background:#c7d2fe;stroke:#4338ca;stroke-width:3}
.box.hit rect{stroke:#d0f;stroke-width:5}
.wire{fill:none;stroke:#999;stroke-width:1.2}
.wire.back{stroke:#c00;stroke-dasharray:5 3}
.wire.jump{stroke:#36c;stroke-dasharray:2 2}
text.blob{font-size:9px;fill:#888}
text.jump{font-size:9px;fill:#36c}
.jump-in,.jump-out{cursor:pointer}
text.caption{font-size:14px;font-weight:bold}
"""

SCRIPT = """
(function(){
'use strict';
var panes=[];
document.querySelectorAll('svg.graph').forEach(function(svg){
  var v=svg.getAttribute('viewBox').split(' ').map(Number);
  svg.removeAttribute('width');svg.removeAttribute('height');
  var p={svg:svg,full:{x:v[0],y:v[1],w:v[2],h:v[3]},vb:null};panes.push(p);home(p);
  var drag=null;
  svg.addEventListener('mousedown',function(e){drag={x:e.clientX,y:e.clientY,vb:p.vb};});
  window.addEventListener('mouseup',function(){drag=null;});
  window.addEventListener('mousemove',function(e){if(!drag)return;var s=scale(p);
    set(p,{x:drag.vb.x-(e.clientX-drag.x)/s,y:drag.vb.y-(e.clientY-drag.y)/s,w:drag.vb.w,h:drag.vb.h});});
  svg.addEventListener('wheel',function(e){e.preventDefault();var r=svg.getBoundingClientRect();
    var f=Math.exp(e.deltaY*0.0015),s=scale(p),cx=p.vb.x+(e.clientX-r.left)/s,cy=p.vb.y+(e.clientY-r.top)/s;
    set(p,{x:cx-(cx-p.vb.x)*f,y:cy-(cy-p.vb.y)*f,w:p.vb.w*f,h:p.vb.h*f});},{passive:false});
  svg.addEventListener('click',function(e){var j=e.target.closest('[data-to]');
    if(j){var t=document.getElementById(j.getAttribute('data-to'));if(t){mark([t]);show(p,t);}}});
});
function scale(p){var r=p.svg.getBoundingClientRect();return Math.min(r.width/p.vb.w,r.height/p.vb.h)||1;}
function set(p,vb){p.vb=vb;p.svg.setAttribute('viewBox',vb.x+' '+vb.y+' '+vb.w+' '+vb.h);}
function home(p){var r=p.svg.getBoundingClientRect(),a=(r.height||600)/(r.width||800),f=p.full;
  var w=f.h/a<=f.w?f.w:Math.min(f.w,(r.width||800)*1.25),c=+(p.svg.getAttribute('data-top-x')||f.w/2);
  set(p,{x:Math.max(f.x,Math.min(c-w/2,f.x+f.w-w)),y:f.y,w:w,h:w*a});}
function whole(p){var r=p.svg.getBoundingClientRect(),a=(r.height||600)/(r.width||800),f=p.full,
  w=Math.max(f.w,f.h/a);set(p,{x:f.x-(w-f.w)/2,y:f.y,w:w,h:w*a});}
function box(el){var m=/translate\\(([-\\d.]+),([-\\d.]+)\\)/.exec(el.getAttribute('transform')||'');
  var rc=el.querySelector('rect');return m&&rc?{x:+m[1],y:+m[2],w:+rc.getAttribute('width'),h:+rc.getAttribute('height')}:null;}
function show(p,el){var b=box(el);if(!b)return;var r=p.svg.getBoundingClientRect(),a=(r.height||600)/(r.width||800);
  var w=Math.max(Math.min(p.vb.w,(r.width||800)*1.2),b.w*3);set(p,{x:b.x+b.w/2-w/2,y:b.y+b.h/2-w*a/2,w:w,h:w*a});}
var hits=[],at=0;
function mark(els){document.querySelectorAll('.box.hit').forEach(function(e){e.classList.remove('hit');});
  els.forEach(function(e){e.classList.add('hit');});}
function search(q){q=q.trim().toLowerCase();hits=[];at=0;
  if(q)document.querySelectorAll('g.box').forEach(function(e){
    var n=(e.getAttribute('data-name')||'').toLowerCase(),t=(e.getAttribute('data-type')||'').toLowerCase();
    if(n.indexOf(q)>=0||t===q)hits.push(e);});
  hits.sort(function(a,b){return (a.getAttribute('data-name').toLowerCase()===q?0:1)-(b.getAttribute('data-name').toLowerCase()===q?0:1);});
  mark(hits);var st=document.getElementById('status');
  st.textContent=q?(hits.length+' match'+(hits.length===1?'':'es')+(hits.length?': '+hits[0].getAttribute('data-name'):'')):'';
  document.body.setAttribute('data-hits',String(hits.length));
  document.body.setAttribute('data-first',hits.length?hits[0].getAttribute('data-name'):'');
  focus();}
function focus(){if(!hits.length)return;var el=hits[at%hits.length],name=el.getAttribute('data-name');
  panes.forEach(function(p){var t=null;p.svg.querySelectorAll('g.box').forEach(function(e){
    if(!t&&e.getAttribute('data-name')===name)t=e;});if(t)show(p,t);});}
var q=document.getElementById('q');
q.addEventListener('input',function(){search(q.value);});
q.addEventListener('keydown',function(e){if(e.key==='Enter'&&hits.length){at++;focus();}});
document.getElementById('home').addEventListener('click',function(){panes.forEach(home);});
document.getElementById('all').addEventListener('click',function(){panes.forEach(whole);});
var args=location.hash+'&'+location.search,m=/[#?&]search=([^&]*)/.exec(args);
if(/[#?&]whole(&|$)/.test(args))panes.forEach(whole);
if(m){q.value=decodeURIComponent(m[1]);search(q.value);}
})();
"""


@dataclass
class Pane:
    caption: str
    scene: Scene


def render_page(title: str, panes: Sequence[Pane], *, summary: str = "",
                legend_extra: Sequence[str] = ()) -> str:
    """The HTML page: a toolbar (search, home, whole graph, legend), an optional text
    summary and one pane per scene, side by side."""
    used = set(legend_extra)
    for pane in panes:
        for b in pane.scene.boxes:
            used.add(b.css)
            if b.mark:
                used.add(f"mark-{b.mark}")
    legend = "".join(f'<span><i class="{k}"></i>{escape(v)}</span>'
                     for k, v in LEGEND.items() if k in used)
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width,initial-scale=1">',
             f"<title>{escape(title)}</title>", f"<style>{STYLE}</style></head><body>",
             f"<header><b>{escape(title)}</b>",
             '<input id="q" type="search" placeholder="search layer name or type" '
             'autocomplete="off">',
             '<span id="status"></span><button id="home">top</button>'
             '<button id="all">whole graph</button>',
             f'<span class="legend">{legend}</span></header>']
    if summary:
        parts.append(f"<details open><summary>summary</summary><pre>{escape(summary)}</pre>"
                     "</details>")
    parts.append("<main>")
    for i, pane in enumerate(panes):
        parts.append(f'<section class="pane"><h2>{escape(pane.caption)}</h2>'
                     f'<div class="canvas">{render_svg(pane.scene, svg_id=f"g{i}")}</div>'
                     "</section>")
    parts.append(f"</main><script>{SCRIPT}</script></body></html>\n")
    return "\n".join(parts)


def graph_page(graph: "Graph", *, title: str | None = None, layers: set[int] | None = None,
               shapes: Mapping[str, str] | None = None, summary: str = "") -> str:
    """The page of one graph (or of the layers in `layers`)."""
    scene = build_scene(graph, layers=layers, shapes=dict(shapes or {}))
    name = title or graph.source.path or "graph"
    return render_page(name, [Pane(name, scene)], summary=summary)


def values_page(graph: "Graph", values: Mapping[str, float], *, label: str = "error",
                title: str | None = None, shapes: Mapping[str, str] | None = None,
                summary: str = "") -> str:
    """The graph with a value per layer (e.g. compare's error per layer) written in each
    box and drawn as its fill, green (smallest) to red (largest) on a log scale. `values`
    is keyed by layer name; layers without a value stay white."""
    scene = build_scene(graph, shapes=dict(shapes or {}))
    for box in scene.boxes:
        if box.layer_id is not None and box.name in values:
            box.value = float(values[box.name])
            box.lines.append(f"{label} {box.value:.3g}")
            box.line_classes.append("value")
    name = title or f"{graph.source.path or 'graph'}: {label} per layer"
    return render_page(name, [Pane(name, scene)], summary=summary)


def diff_page(a: "Graph", b: "Graph", diff: "GraphDiff", *, title: str | None = None,
              a_caption: str | None = None, b_caption: str | None = None,
              max_layers: int = MAX_LAYERS, context: int = CONTEXT) -> str:
    """Both graphs side by side: removed / changed / renamed layers marked in A, added /
    changed / renamed in B; the text diff as the summary. A graph larger than `max_layers`
    is drawn only around what changed (`context` hops), and the summary says so."""
    b_to_a = {v: k for k, v in diff.pairs.items()}
    changed_b = {c.layer for c in diff.changed}
    renamed_b = {n for _, n in diff.renamed}
    a_part = b_part = None
    summary = diff.format()
    if max(len(a), len(b)) > max_layers:
        b_touched = [lay.id for lay in b if lay.name in changed_b or lay.name in renamed_b
                     or lay.id not in b_to_a]
        a_touched = [lay.id for lay in diff.removed] + [b_to_a[i] for i in b_touched
                                                        if i in b_to_a]
        a_part = around_layers(a, a_touched[:max_layers], context)
        b_part = around_layers(b, b_touched[:max_layers], context)
        summary = (f"the graphs are large ({len(a)} and {len(b)} layers): drawn are the "
                   f"layers within {context} hops of a change ({len(a_part)} and "
                   f"{len(b_part)})\n" + summary)
    a_shapes = blob_shapes(a)
    a_scene = build_scene(a, layers=a_part, shapes=a_shapes)
    b_scene = build_scene(b, layers=b_part,
                          shapes=_carried_shapes(a, b, a_shapes, b_to_a, changed_b, b_part))
    b_marks = {lay.id: "added" for lay in diff.added}
    a_marks = {lay.id: "removed" for lay in diff.removed}
    for lay in b:
        mark = ("changed" if lay.name in changed_b else
                "renamed" if lay.name in renamed_b else "")
        if mark and lay.id in b_to_a:
            b_marks[lay.id] = mark
            a_marks[b_to_a[lay.id]] = mark
    for scene, marks in ((a_scene, a_marks), (b_scene, b_marks)):
        for box in scene.boxes:
            if box.layer_id is not None:
                box.mark = marks.get(box.layer_id, "")
    return render_page(title or f"{diff.a_path} -> {diff.b_path}",
                       [Pane(a_caption or f"before: {diff.a_path}", a_scene),
                        Pane(b_caption or f"after: {diff.b_path}", b_scene)],
                       summary=summary)


def _carried_shapes(a: "Graph", b: "Graph", a_shapes: dict[str, str], b_to_a: dict[int, int],
                    changed_b: set[str], layers: set[int] | None) -> dict[str, str]:
    """B's known shapes, plus A's shape of each blob B's unchanged layers still write under
    the same name (a pass output has no traced shapes of its own)."""
    shapes = blob_shapes(b)
    for lay in b if layers is None else (b.layer(i) for i in layers):
        if lay.id not in b_to_a or lay.name in changed_b:
            continue
        for blob in lay.outputs:
            if blob in a_shapes and blob not in shapes:
                shapes[blob] = a_shapes[blob]
    return shapes
