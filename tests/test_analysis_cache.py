"""Graph.analysis: computed once per edit version, recomputed after any edit; validate() and
lint share it; the type index follows a layer's type change."""

from __future__ import annotations

import paramsurgery
from paramsurgery.lint import lint_graph
from paramsurgery.analysis.validate import validate

TEXT = """7767517
4 4
Input in0 0 1 in0
ReLU relu_0 1 1 in0 a 0=0.1
Sigmoid sig_0 1 1 a b
ReLU relu_1 1 1 b out0
"""


def test_analysis_is_shared_until_an_edit() -> None:
    g = paramsurgery.loads(TEXT)
    calls: list[int] = []

    def count(graph: paramsurgery.Graph) -> int:
        calls.append(1)
        return len(graph)

    assert g.analysis("n", count) == 4 and g.analysis("n", count) == 4
    assert len(calls) == 1
    edits = [lambda: g.layer("relu_0").set(0, 0.2),
             lambda: setattr(g.layer("sig_0"), "name", "sig_x"),
             lambda: g.set_input("relu_1", 0, "a"),
             lambda: g.add_layer("TanH", "t", ["b"], ["c"]),
             lambda: g.remove_layer("t"),
             lambda: g.rename_blob("a", "a2")]
    for i, edit in enumerate(edits):
        v = g.version
        edit()
        assert g.version != v, i
        g.analysis("n", count)
        assert len(calls) == i + 2, i


def test_validate_is_cached_and_lint_reuses_it(monkeypatch) -> None:  # noqa: ANN001
    import paramsurgery.analysis.validate as V

    runs: list[int] = []
    real = V.validate_graph
    monkeypatch.setattr(V, "validate_graph", lambda g: runs.append(1) or real(g))
    g = paramsurgery.loads(TEXT)
    assert validate(g) == []
    lint_graph(g, run=False)
    assert len(runs) == 1
    g.layer("relu_1").name = "relu_2"  # an edit: computed again
    validate(g)
    assert len(runs) == 2
    found = validate(g)
    found.append("caller's list")  # callers get their own list
    assert validate(g) == []


def test_type_change_moves_the_layer_in_the_type_index() -> None:
    g = paramsurgery.loads(TEXT)
    layer = g.layer("sig_0")
    layer.type = "TanH"
    assert [x.name for x in g.by_type("TanH")] == ["sig_0"]
    assert g.by_type("Sigmoid") == []
    g.remove_layer(layer)  # the index entry is where remove_layer looks for it
    assert g.by_type("TanH") == [] and len(g) == 3
