"""The shared matching layer: MatchFailure(layer, reason) raised by the shared walks, so every
pass's --explain words a broken chain the same way."""

import pytest

import paramsurgery
from paramsurgery.core.match import MatchFailure
from paramsurgery.patterns.match import (above_splits, chain_up, readers_through_splits, single_reader,
                                         source_of, through_splits)

G = paramsurgery.loads("""7767517
7 9
Input in0 0 1 ids
Embed emb 1 1 ids e 0=4 1=10 3=40
Reshape r 1 1 e r0 0=4 1=-1
Split sp 1 2 r0 r1 r2
ReLU a 1 1 r1 x
BinaryOp add 2 1 r2 x y 0=0
Permute p 1 1 y z 0=1
""", "m.param")


def test_split_walks_both_ways():
    assert above_splits(G, "r2") == ("r0", [G.layer("sp")])
    assert source_of(G, "r1").name == "r"
    assert [layer.name for layer in through_splits(G, "r0")] == ["add", "a"]
    readers, splits = readers_through_splits(G, "r0")
    assert sorted((layer.name, slot) for layer, slot in readers) == [("a", 0), ("add", 0)]
    assert [s.name for s in splits] == ["sp"]


def test_single_reader_names_the_others():
    assert single_reader(G, "e").name == "r"
    two = paramsurgery.loads("7767517\n3 3\nInput in0 0 1 x\nReLU a 1 1 x y\n"
                             "TanH b 1 1 x z\n", "two.param")  # no Split: two readers
    with pytest.raises(MatchFailure, match=r"'x' is read by 2 layers \(ReLU 'a', TanH 'b'\)") as exc:
        single_reader(two, "x")
    assert exc.value.layer == "in0"
    with pytest.raises(MatchFailure, match=r"nothing reads 'z'") as exc:
        single_reader(G, "z")
    assert exc.value.layer == "p" and str(exc.value) == exc.value.reason


def test_chain_up_to_a_type_or_where_it_stopped():
    top, chain = chain_up(G, "r0", ("Reshape",), ("Embed",))
    assert top.name == "emb" and [c.name for c in chain] == ["r"]
    with pytest.raises(MatchFailure, match=r"blob 'y' comes from BinaryOp 'add', not from an Embed "
                                      r"through layers \(Reshape\)") as exc:
        chain_up(G, "y", ("Reshape",), ("Embed",), goal="an Embed")
    assert exc.value.layer == "add"
    # with a reader: a chain shared with another layer cannot be rewritten
    with pytest.raises(MatchFailure, match=r"'r0' \(Reshape 'r'\) is also read by 'sp'"):
        chain_up(G, "r0", ("Reshape",), ("Embed",), reader=G.layer("p"))
    assert "line 3: Embed emb" not in MatchFailure(None, "x").format()
    assert MatchFailure(G.layer("emb"), "why").format() == "line 4: Embed emb: why"


def test_walk_up_visits_each_blob_once_through_given_types():
    from paramsurgery.patterns.match import visit_once, walk_up

    # from z up through the given types (Permute, BinaryOp, ReLU, Split, Reshape): it reaches
    # Embed's output and stops there (Embed is not given), so the ids are never visited
    seen = [(b, p.name if p else None) for b, p in
            walk_up(G, ["z"], ("Permute", "BinaryOp", "Split", "Reshape", "ReLU"))]
    assert [b for b, _ in seen].count("r0") == 1  # two paths (r1, r2) reach r0: once
    assert seen[0] == ("z", "p") and ("e", "emb") in seen and "ids" not in [b for b, _ in seen]
    # a seen set shared between walks: the second walk yields only what is new
    shared: set[str] = set()
    first = [b for b, _ in walk_up(G, ["x"], ("ReLU", "Split"), shared)]
    second = [b for b, _ in walk_up(G, ["y"], ("BinaryOp", "ReLU", "Split"), shared)]
    assert first == ["x", "r1", "r0"] and second == ["y", "r2"]
    # the caller may stop early: expand runs only after an item is taken
    calls: list[int] = []
    it = visit_once([1], lambda n: calls.append(n) or [n + 1])
    assert [next(it), next(it)] == [1, 2] and calls == [1]


def test_cone_stops_at_cut_blobs_and_stays_within():
    from paramsurgery.ir.cone import cone

    ids = {layer.name: layer.id for layer in G}
    names = {v: k for k, v in ids.items()}
    full = cone(G, [ids["p"]])
    assert {names[i] for i in full} == {"in0", "emb", "r", "sp", "a", "add", "p"}
    # cut at x: the ReLU branch is not needed, the Split still is (through r2)
    assert {names[i] for i in cone(G, [ids["p"]], stop={"x"})} == {"in0", "emb", "r", "sp",
                                                                    "add", "p"}
    assert {names[i] for i in cone(G, [ids["p"]], stop={"x", "r2"})} == {"add", "p"}
    within = {ids["add"], ids["a"], ids["sp"]}
    assert {names[i] for i in cone(G, [ids["p"]], within=within)} == {"p", "add", "a", "sp"}
