"""IR edits keep the indexes, the networkx view and ncnn-validity consistent."""

import ncnn
import pytest

import paramsurgery
from paramsurgery import GraphError
from paramsurgery.core.findings import ERROR

from conftest import CORPUS, ncnn_loads
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.param_text import dump_bytes
from paramsurgery.formats.param_text import dumps

CHAIN = ("7767517\n4 4\nInput in 0 1 x\nReLU a 1 1 x y\nSigmoid b 1 1 y z\n"
         "BinaryOp c 1 1 z out 0=2 1=1 2=2.0\n")


def errors(g):
    return [f for f in validate(g) if f.severity == ERROR]


def assert_consistent(g):
    """networkx edges == what the layer lists say; ncnn accepts the text."""
    expect = set()
    for layer in g:
        for slot, b in enumerate(layer.inputs):
            p = g.producer_slot(b)
            if p is not None:
                expect.add((p[0].id, layer.id, slot, b, p[1]))
    got = {(u, v, k, d["blob"], d["src"]) for u, v, k, d in g.nx.edges(keys=True, data=True)}
    assert got == expect
    assert set(g.nx.nodes) == {layer.id for layer in g}
    assert not errors(g), errors(g)
    assert ncnn_loads(dumps(g)) == 0


def test_insert_after_keeps_blob_names_of_readers():
    g = paramsurgery.loads(CHAIN)
    new = g.insert_after("a", "Dropout", "drop")
    assert new.outputs == ("y",) and g.layer("a").outputs != ("y",)
    assert [l.name for l in g] == ["in", "a", "drop", "b", "c"]
    assert_consistent(g)


def test_insert_before_and_bypass_restore_the_file():
    g = paramsurgery.loads(CHAIN)
    g.insert_before("b", "Noop", "n")
    assert g.layer("b").inputs != ("y",)
    assert_consistent(g)
    g.bypass("n")
    assert_consistent(g)
    assert dumps(g).splitlines()[2:] == CHAIN.splitlines()[2:4] + [
        "Sigmoid                  b                        1 1 y z",
        "BinaryOp c 1 1 z out 0=2 1=1 2=2.0"]


def test_bypass_of_the_last_layer_keeps_the_output_name():
    g = paramsurgery.loads(CHAIN)
    g.bypass("c")
    assert g.outputs == ["out"]
    assert_consistent(g)


def test_split_insertion_and_removal():
    g = paramsurgery.loads("7767517\n4 4\nInput in 0 1 x\nReLU a 1 1 x y\nSigmoid b 1 1 x z\n"
                           "BinaryOp c 2 1 y z out 0=0\n")
    assert [f.code for f in errors(g)] == ["PS106"]
    net = ncnn.Net()
    assert net.load_param_mem(dumps(g)) == 0  # loads, but would crash at run time
    g.insert_splits()
    assert_consistent(g)
    split = g.by_type("Split")[0]
    assert len(split.outputs) == 2
    g.add_layer("Split", "lonely", ["out"], ["out_copy"])
    assert "PS107" in [f.code for f in validate(g)]
    g.remove_trivial_splits()
    assert not g.find("lonely") and g.outputs == ["out_copy"]  # the output name survives
    assert_consistent(g)


def test_same_layer_reading_a_blob_twice_needs_no_split():
    g = paramsurgery.loads("7767517\n2 2\nInput in 0 1 x\nBinaryOp m 2 1 x x out 0=2\n")
    assert not errors(g)
    g.insert_splits()
    assert not g.by_type("Split")


def test_add_layer_finds_a_topological_position():
    g = paramsurgery.loads(CHAIN)
    g.add_layer("Sigmoid", "s2", ["y"], ["w"])
    g.add_layer("BinaryOp", "mix", ["w", "out"], ["o2"], {0: 0})
    assert [l.name for l in g].index("s2") == 2
    g.insert_splits()
    assert_consistent(g)


def test_add_layer_refuses_a_second_producer():
    g = paramsurgery.loads(CHAIN)
    with pytest.raises(GraphError, match="already has a producer"):
        g.add_layer("ReLU", "dup", ["x"], ["y"])


def test_toposort_repairs_order_and_detects_cycles():
    g = paramsurgery.loads("7767517\n3 3\nInput in 0 1 x\nSigmoid b 1 1 y z\nReLU a 1 1 x y\n")
    assert "PS105" in [f.code for f in errors(g)]
    g.toposort()
    assert [l.name for l in g] == ["in", "a", "b"]
    assert_consistent(g)
    cyc = paramsurgery.loads("7767517\n3 3\nInput in 0 1 x\nBinaryOp a 2 1 x q p 0=0\n"
                             "ReLU b 1 1 p q\n")
    with pytest.raises(GraphError, match="cycle"):
        cyc.toposort()


def test_remove_dead_follows_producers():
    g = paramsurgery.loads("7767517\n5 5\nInput in 0 1 x\nSplit s 1 2 x x0 x1\nReLU a 1 1 x0 y\n"
                           "Sigmoid b 1 1 y z\nTanH t 1 1 x1 out\n")
    removed = g.remove_dead(["b"])
    assert set(removed) == {"b", "a"}
    g.remove_trivial_splits()
    assert_consistent(g)


def test_rename_blob_and_rewire():
    g = paramsurgery.loads(CHAIN)
    g.rename_blob("y", "hidden")
    assert g.layer("b").inputs == ("hidden",)
    g.set_input("c", 0, "hidden")
    g.remove_dead(["b"])
    assert_consistent(g)
    with pytest.raises(GraphError):
        g.rename_blob("hidden", "x")


def test_replace_layer_keeps_position():
    g = paramsurgery.loads(CHAIN)
    g.replace_layer("b", "TanH")
    assert [l.type for l in g] == ["Input", "ReLU", "TanH", "BinaryOp"]
    assert_consistent(g)


def test_edits_on_a_real_graph_stay_loadable():
    g = paramsurgery.load(CORPUS / "resnet18.param")
    for conv in g.by_type("Convolution")[:5]:
        g.insert_after(conv, "Noop", f"noop_{conv.name}")
    for relu in g.by_type("ReLU")[:3]:
        g.bypass(relu)
    assert_consistent(g)
    copy = g.copy()
    assert dumps(copy) == dumps(g)
    copy.layer("prob").set(0, 0)
    assert dumps(copy) != dumps(g)


def test_deep_chain_is_handled_iteratively():
    n = 100_000
    lines = ["Input in 0 1 b0"] + [f"ReLU r{i} 1 1 b{i} b{i + 1}" for i in range(n)]
    text = f"7767517\n{n + 1} {n + 1}\n" + "\n".join(lines) + "\n"
    g = paramsurgery.loads(text)
    assert not validate(g)
    g.toposort()
    assert dump_bytes(g) == text.encode()
    g.remove_dead([g.layer(f"r{n - 1}").id], keep=())
    assert len(g) == 1
