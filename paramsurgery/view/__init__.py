"""Pictures of graphs: `paramsurgery view`, `diff` (and `--html`), `--report` on every
graph-writing command, and the per-layer values page `compare --html` draws.

- `graph_page(graph)`: one graph as a self-contained HTML page;
- `diff_graphs(a, b)` → `GraphDiff` (added / removed / renamed / changed, JSON, text);
  `diff_page(a, b, diff)`: both side by side with the changes coloured;
- `values_page(graph, {layer name: value}, label=...)`: a value per layer (an error, a time)
  written in each box and drawn as its fill.
"""

from paramsurgery.view.diff import GraphDiff, LayerChange, diff_graphs
from paramsurgery.view.page import diff_page, graph_page, render_page, values_page

__all__ = ["GraphDiff", "LayerChange", "diff_graphs", "diff_page", "graph_page", "render_page",
           "values_page"]
