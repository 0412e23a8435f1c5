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

import json
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

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
    "hub": "hub: read by many layers, not expanded",
    "group": "repeated blocks (click to expand)",
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
.box.hub rect,.legend .hub{fill:#ede9fe;background:#ede9fe;stroke:#6d28d9;stroke-dasharray:6 2}
.box.group rect,.legend .group{fill:#e0f2fe;background:#e0f2fe;stroke:#0369a1;stroke-width:3}
.box.group{cursor:pointer}
.box.first rect{stroke:#000;stroke-width:5;stroke-dasharray:8 3}
.box .changed{fill:#9a3412;font-weight:bold}
.box .first{fill:#000;font-weight:bold}
.box.picked rect{stroke:#2563eb;stroke-width:4}
.wire.bus{stroke:#36c;stroke-width:4;stroke-linecap:round}
.bus{cursor:pointer}
.scale{display:inline-flex;align-items:center;gap:4px}
.scale i{display:inline-block;width:14px;height:10px;border:1px solid #555}
#panel{width:24em;max-width:40vw;overflow:auto;border-left:1px solid #ccc;padding:6px 10px;font-size:12px;background:#fcfcfc}
#panel h3{margin:2px 0 6px;font-size:14px;word-break:break-all}
#panel table{border-collapse:collapse;width:100%}
#panel td{border-top:1px solid #eee;padding:2px 4px;vertical-align:top;font:12px ui-monospace,Menlo,Consolas,monospace;word-break:break-all}
#panel td.dflt{color:#999}
#panel .chg{color:#9a3412;font-weight:bold;white-space:pre-wrap;font:12px ui-monospace,Menlo,Consolas,monospace}
#panel .close{float:right}
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
var panes=[],info={};
document.querySelectorAll('script.info').forEach(function(s){
  var d=JSON.parse(s.textContent);for(var k in d)info[k]=d[k];});
document.querySelectorAll('svg.graph').forEach(function(svg){
  var v=svg.getAttribute('viewBox').split(' ').map(Number);
  svg.removeAttribute('width');svg.removeAttribute('height');
  var p={svg:svg,full:{x:v[0],y:v[1],w:v[2],h:v[3]},vb:null};panes.push(p);p.vb=p.full;
  var drag=null,moved=false;
  svg.addEventListener('mousedown',function(e){drag={x:e.clientX,y:e.clientY,vb:p.vb};moved=false;});
  window.addEventListener('mouseup',function(){drag=null;});
  window.addEventListener('mousemove',function(e){if(!drag)return;var s=scale(p);
    if(Math.abs(e.clientX-drag.x)+Math.abs(e.clientY-drag.y)>3)moved=true;
    set(p,{x:drag.vb.x-(e.clientX-drag.x)/s,y:drag.vb.y-(e.clientY-drag.y)/s,w:drag.vb.w,h:drag.vb.h});});
  svg.addEventListener('wheel',function(e){e.preventDefault();var r=svg.getBoundingClientRect();
    var f=Math.exp(e.deltaY*0.0015),s=scale(p),cx=p.vb.x+(e.clientX-r.left)/s,cy=p.vb.y+(e.clientY-r.top)/s;
    set(p,{x:cx-(cx-p.vb.x)*f,y:cy-(cy-p.vb.y)*f,w:p.vb.w*f,h:p.vb.h*f});},{passive:false});
  svg.addEventListener('click',function(e){if(moved)return;
    var j=e.target.closest('[data-to]');
    if(j){var t=document.getElementById(j.getAttribute('data-to'));if(t){mark([t]);show(p,t);}return;}
    var b=e.target.closest('g.box');if(!b)return;
    if(b.hasAttribute('data-expand')){expand(b.getAttribute('data-expand'));return;}
    pick(b);});
});
function visible(p){return p.svg.style.display!=='none';}
function pane(el){var s=el.closest('svg');for(var i=0;i<panes.length;i++)if(panes[i].svg===s)return panes[i];return null;}
function scale(p){var r=p.svg.getBoundingClientRect();return Math.min(r.width/p.vb.w,r.height/p.vb.h)||1;}
function set(p,vb){p.vb=vb;p.svg.setAttribute('viewBox',vb.x+' '+vb.y+' '+vb.w+' '+vb.h);}
function dims(p){var r=p.svg.getBoundingClientRect();return {w:r.width||800,h:r.height||600};}
function home(p){var c=p.svg.getAttribute('data-center'),el=c&&document.getElementById(c);
  if(el){show(p,el,dims(p).w);return;}
  var d=dims(p),a=d.h/d.w,f=p.full;
  if(Math.min(d.w/f.w,d.h/f.h)>=0.45){whole(p);return;}
  var w=f.h/a<=f.w?f.w:Math.min(f.w,d.w*1.25),x=+(p.svg.getAttribute('data-top-x')||f.w/2);
  set(p,{x:Math.max(f.x,Math.min(x-w/2,f.x+f.w-w)),y:f.y,w:w,h:w*a});}
function whole(p){var d=dims(p),a=d.h/d.w,f=p.full,w=Math.max(f.w,f.h/a);
  set(p,{x:f.x-(w-f.w)/2,y:f.y-(w*a-f.h)/2,w:w,h:w*a});}
function box(el){var m=/translate\\(([-\\d.]+),([-\\d.]+)\\)/.exec(el.getAttribute('transform')||'');
  var rc=el.querySelector('rect');return m&&rc?{x:+m[1],y:+m[2],w:+rc.getAttribute('width'),h:+rc.getAttribute('height')}:null;}
function show(p,el,width){var b=box(el);if(!b)return;var d=dims(p),a=d.h/d.w;
  var w=width||Math.max(Math.min(p.vb.w,d.w*1.2),b.w*3);set(p,{x:b.x+b.w/2-w/2,y:b.y+b.h/2-w*a/2,w:w,h:w*a});}
function reveal(p){if(visible(p))return;
  p.svg.parentNode.querySelectorAll('svg.graph').forEach(function(s){s.style.display=s===p.svg?'':'none';});
  home(p);document.body.setAttribute('data-showing',p.svg.id);}
function expand(id){var t=document.getElementById(id);if(!t)return;var p=pane(t);reveal(p);mark([t]);show(p,t,dims(p).w);}
var hits=[],at=0;
function mark(els){document.querySelectorAll('.box.hit').forEach(function(e){e.classList.remove('hit');});
  els.forEach(function(e){e.classList.add('hit');});}
function search(q){q=q.trim().toLowerCase();hits=[];at=0;
  if(q)document.querySelectorAll('svg.graph:not(.overview) g.box').forEach(function(e){
    var n=(e.getAttribute('data-name')||'').toLowerCase(),t=(e.getAttribute('data-type')||'').toLowerCase();
    if(n.indexOf(q)>=0||t===q)hits.push(e);});
  hits.sort(function(a,b){return (a.getAttribute('data-name').toLowerCase()===q?0:1)-(b.getAttribute('data-name').toLowerCase()===q?0:1);});
  mark(hits);var st=document.getElementById('status');
  st.textContent=q?(hits.length+' match'+(hits.length===1?'':'es')+(hits.length?': '+hits[0].getAttribute('data-name'):'')):'';
  document.body.setAttribute('data-hits',String(hits.length));
  document.body.setAttribute('data-first',hits.length?hits[0].getAttribute('data-name'):'');
  focus();}
function focus(){if(!hits.length)return;var el=hits[at%hits.length],name=el.getAttribute('data-name');
  panes.forEach(function(p){if(p.svg.classList.contains('overview'))return;var t=null;
    p.svg.querySelectorAll('g.box').forEach(function(e){if(!t&&e.getAttribute('data-name')===name)t=e;});
    if(t){reveal(p);show(p,t);}});}
function add(parent,tag,text,cls){var e=document.createElement(tag);if(text!==undefined)e.textContent=text;
  if(cls)e.className=cls;parent.appendChild(e);return e;}
function pick(b){document.querySelectorAll('.box.picked').forEach(function(e){e.classList.remove('picked');});
  b.classList.add('picked');var d=info[b.id],body=document.getElementById('panel-body');
  body.textContent='';document.getElementById('panel').hidden=false;
  document.body.setAttribute('data-picked',b.getAttribute('data-name')||'');
  if(!d){add(body,'h3',b.getAttribute('data-name'));add(body,'pre',(b.querySelector('title')||{}).textContent||'');return;}
  add(body,'h3',d.type+' '+d.name);
  if(d.value!==undefined)add(body,'div',d.value,'chg');
  if(d.changes&&d.changes.length){add(body,'b','changed');d.changes.forEach(function(c){add(body,'div',c,'chg');});}
  (d.note||[]).forEach(function(c){add(body,'div',c);});
  var t=add(body,'table');
  function row(k,v,cls){var r=add(t,'tr');add(r,'td',k,cls);var c=add(r,'td',v,cls);return c;}
  d['in'].forEach(function(x,i){row('in '+i,x[0]+(x[1]?' '+x[1]:''));});
  d.out.forEach(function(x,i){row('out '+i,x[0]+(x[1]?' '+x[1]:''));});
  d.params.forEach(function(x){row(x[0]+(x[1]?' '+x[1]:''),x[2]+(x[3]?' (default)':''),x[3]?'dflt':'');});
  if(!d.params.length)row('params','none');
  (d.weights||[]).forEach(function(x){row('weights',x);});
  if(d.line)row('line',String(d.line));}
document.getElementById('panel-close').addEventListener('click',function(){document.getElementById('panel').hidden=true;});
var q=document.getElementById('q');
q.addEventListener('input',function(){search(q.value);});
q.addEventListener('keydown',function(e){if(e.key==='Enter'&&hits.length){at++;focus();}});
document.getElementById('home').addEventListener('click',function(){panes.forEach(function(p){if(visible(p))home(p);});});
document.getElementById('all').addEventListener('click',function(){panes.forEach(function(p){
  if(p.svg.classList.contains('overview'))return;reveal(p);whole(p);});});
var ov=document.getElementById('overview');
if(ov)ov.addEventListener('click',function(){panes.forEach(function(p){if(p.svg.classList.contains('overview'))reveal(p);});});
panes.forEach(function(p){if(visible(p))home(p);});
var args=location.hash+'&'+location.search,m=/[#?&]search=([^&]*)/.exec(args);
if(/[#?&]whole(&|$)/.test(args))document.getElementById('all').click();
if(/[#?&]expand(&|$)/.test(args))panes.forEach(function(p){if(!p.svg.classList.contains('overview'))reveal(p);});
var pk=/[#?&]pick=([^&]*)/.exec(args);
if(m){q.value=decodeURIComponent(m[1]);search(q.value);}
if(pk){var n=decodeURIComponent(pk[1]),els=document.querySelectorAll('svg.graph:not(.overview) g.box');
  for(var i=0;i<els.length;i++)if(els[i].getAttribute('data-name')===n){var pp=pane(els[i]);
    if(!m){reveal(pp);show(pp,els[i]);}pick(els[i]);break;}}
})();
"""


@dataclass
class Pane:
    caption: str
    scene: Scene
    center: int | None = None  # the box the pane opens on
    overview: Scene | None = None  # drawn first, the scene one click away


def render_page(title: str, panes: Sequence[Pane], *, summary: str = "",
                legend_extra: Sequence[str] = (), legend_html: str = "") -> str:
    """The HTML page: a toolbar (search, home, whole graph, legend), an optional text
    summary, one pane per scene, side by side, and the side panel a click on a box fills
    (every param in full)."""
    used = set(legend_extra)
    for pane in panes:
        for sc in (pane.scene, pane.overview):
            for b in sc.boxes if sc is not None else ():
                used.add(b.css)
                if b.mark:
                    used.add(f"mark-{b.mark}")
    legend = "".join(f'<span><i class="{k}"></i>{escape(v)}</span>'
                     for k, v in LEGEND.items() if k in used)
    overview = any(p.overview is not None for p in panes)
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width,initial-scale=1">',
             f"<title>{escape(title)}</title>", f"<style>{STYLE}</style></head><body>",
             f"<header><b>{escape(title)}</b>",
             '<input id="q" type="search" placeholder="search layer name or type" '
             'autocomplete="off">',
             '<span id="status"></span><button id="home">top</button>'
             + ('<button id="overview">overview</button>' if overview else "") +
             '<button id="all">whole graph</button>',
             f'<span class="legend">{legend}{legend_html}</span></header>']
    if summary:
        parts.append(f"<details open><summary>summary</summary><pre>{escape(summary)}</pre>"
                     "</details>")
    parts.append("<main>")
    for i, pane in enumerate(panes):
        svgs = []
        if pane.overview is not None:
            svgs.append(render_svg(pane.overview, svg_id=f"g{i}o").replace(
                'class="graph"', 'class="graph overview"', 1))
            svgs.append(_info_json(pane.overview, f"g{i}o"))
        svgs.append(render_svg(pane.scene, svg_id=f"g{i}", center=pane.center,
                               hidden=pane.overview is not None))
        svgs.append(_info_json(pane.scene, f"g{i}"))
        parts.append(f'<section class="pane"><h2>{escape(pane.caption)}</h2>'
                     f'<div class="canvas">{"".join(svgs)}</div></section>')
    parts.append('<aside id="panel" hidden><button id="panel-close" class="close">×</button>'
                 '<div id="panel-body"></div></aside>')
    parts.append(f"</main><script>{SCRIPT}</script></body></html>\n")
    return "\n".join(parts)


def _info_json(scene: Scene, svg_id: str) -> str:
    """The side panel's data of a scene's boxes, keyed by the boxes' element ids."""
    data = {f"{svg_id}-n{i}": b.info for i, b in enumerate(scene.boxes) if b.info is not None}
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    return f'<script type="application/json" class="info">{text}</script>'


def graph_page(graph: "Graph", *, title: str | None = None, layers: set[int] | None = None,
               shapes: Mapping[str, str] | None = None, summary: str = "",
               hubs: Iterable[int] = (), center: str | None = None,
               overview: bool = True) -> str:
    """The page of one graph (or of the layers in `layers`, the `hubs` left out drawn as a
    stub each). `center`: the layer the page opens on. A whole graph made of repeated
    blocks (a decoder's) opens on its overview, the blocks drawn as one group box that a
    click expands (`overview=False`: the whole graph at once)."""
    shapes = dict(shapes or {})
    scene = build_scene(graph, layers=layers, shapes=shapes, hubs=hubs)
    name = title or graph.source.path or "graph"
    at = scene.box_of_layer().get(center) if center is not None else None
    over = None
    if overview and layers is None:
        from paramsurgery.view.overview import find_blocks, overview_scene

        blocks = find_blocks(graph)
        if blocks is not None:
            over = overview_scene(graph, blocks, shapes, scene.box_of_layer(), "g0")
            summary = (summary + "\n" if summary else "") + blocks.describe(graph)
    return render_page(name, [Pane(name, scene, center=at, overview=over)], summary=summary)


def values_page(graph: "Graph", values: Mapping[str, float], *, label: str = "error",
                title: str | None = None, shapes: Mapping[str, str] | None = None,
                summary: str = "", threshold: float | None = None,
                over: Iterable[str] | None = None, first: str | None = None) -> str:
    """The graph with a value per layer (e.g. compare's error per layer) written in each
    box and drawn as its fill, on a log scale. Without `threshold`: green (smallest) to red
    (largest). With it, the tolerance is the colour break: layers in `over` (default: those
    above `threshold`) are yellow to red, the rest green, and a legend says so. `first`
    (the first divergence) is outlined, labelled, and the page opens on it. `values` is
    keyed by layer name; layers without a value stay white."""
    scene = build_scene(graph, shapes=dict(shapes or {}))
    scene.threshold = threshold
    bad = set(over) if over is not None else (
        {k for k, v in values.items() if threshold is not None and v > threshold})
    at = None
    for i, box in enumerate(scene.boxes):
        if box.layer_id is not None and box.name in values:
            box.value = float(values[box.name])
            box.over = box.name in bad if threshold is not None else None
            box.lines.append(f"{label} {box.value:.3g}"
                             + (" > tol" if box.over else " ok" if box.over is False else ""))
            box.line_classes.append("value")
            if box.info is not None:
                box.info["value"] = box.lines[-1]
        if first is not None and box.layer_id is not None and box.name == first and at is None:
            at = i
            box.css += " first"
            box.lines.append("▶ first divergence")
            box.line_classes.append("first")
    name = title or f"{graph.source.path or 'graph'}: {label} per layer"
    legend = _value_legend(scene, label, threshold, first) if threshold is not None else ""
    return render_page(name, [Pane(name, scene, center=at)], summary=summary,
                       legend_html=legend)


def _value_legend(scene: Scene, label: str, threshold: float, first: str | None) -> str:
    """The colour scale: green up to the tolerance, yellow to red above it, up to the
    largest value drawn; and the first divergence's outline."""
    from paramsurgery.view.svg import value_colour, value_scale

    sc = value_scale(scene)
    top = max((b.value for b in scene.boxes if b.value is not None), default=0.0)
    swatch = '<i style="background:{}"></i>'.format
    parts = [f"<b>{escape(label)}</b>", swatch(value_colour(0.0, sc, threshold, False)),
             f"≤ tol {threshold:.3g}: agrees",
             swatch(value_colour(threshold * 1.01, sc, threshold, True)),
             "&gt; tol: differs", swatch(value_colour(max(top, threshold * 10), sc, threshold,
                                                      True)),
             f"max {top:.3g}"]
    if first is not None:
        parts.append(f'<i style="border:3px dashed #000"></i>first divergence: {escape(first)}')
    return f'<span class="scale" id="value-legend">{"".join(parts)}</span>'


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
    changes = {c.layer: c for c in diff.changed}
    a_names = {b_to_a[lay.id]: lay.name for lay in b if lay.id in b_to_a}
    renamed_from = dict((n, o) for o, n in diff.renamed)
    for scene, marks, side in ((a_scene, a_marks, "a"), (b_scene, b_marks, "b")):
        for box in scene.boxes:
            if box.layer_id is None:
                continue
            box.mark = marks.get(box.layer_id, "")
            b_name = box.name if side == "b" else a_names.get(box.layer_id)
            change = changes.get(b_name) if b_name is not None else None
            extra = change.box_lines() if change is not None else []
            if b_name in renamed_from:
                extra.insert(0, f"renamed {renamed_from[b_name]} → {b_name}")
            if extra:  # what changed, in the box, nothing cut
                box.lines.extend(extra)
                box.line_classes.extend(["changed"] * len(extra))
                if box.info is not None:
                    box.info["changes"] = extra
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
