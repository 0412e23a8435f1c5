"""Property tests: random valid graphs survive save → load unchanged, in any text layout;
random edit sequences keep graphs valid for ncnn (its load_param is the oracle)."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery.core.findings import ERROR
from paramsurgery.core.values import pnnx_float

from conftest import ncnn_loads
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.param_text import dump_bytes
from paramsurgery.formats.param_text import dumps

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_./:", min_size=1, max_size=12)
FLOAT = st.floats(min_value=-1e30, max_value=1e30, allow_nan=False).map(np.float32)


@st.composite
def graphs(draw):
    """A random valid graph as a list of (type, name, inputs, outputs, params-text)."""
    n_inputs = draw(st.integers(1, 3))
    counter = iter(range(10_000))
    blob = lambda: f"b{next(counter)}"  # noqa: E731
    ins = [blob() for _ in range(n_inputs)]
    layers = [("Input", "in", [], ins, "")]
    avail = list(ins)
    for i in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["unary", "binary", "concat", "split", "slice", "reshape",
                                     "gemm", "crop", "reduction"]))
        name = draw(NAME) + f"_{i}"
        if kind in ("binary", "concat") and len(avail) >= 2:
            k = 2 if kind == "binary" else draw(st.integers(2, min(4, len(avail))))
            picks = draw(st.permutations(avail))[:k]
        else:
            picks = [draw(st.sampled_from(avail))]
            kind = kind if kind not in ("binary", "concat") else "unary"
        for p in picks:
            avail.remove(p)
        if kind == "unary":
            t = draw(st.sampled_from(["ReLU", "Sigmoid", "TanH", "Swish", "Noop"]))
            params = f"0={pnnx_float(draw(FLOAT))}" if t == "ReLU" and draw(st.booleans()) else ""
            outs = [blob()]
        elif kind == "binary":
            t = "BinaryOp"
            params = f"0={draw(st.integers(0, 11))}"
            outs = [blob()]
        elif kind == "concat":
            t, params, outs = "Concat", f"0={draw(st.integers(-3, 2))}", [blob()]
        elif kind == "split":
            t, params = "Split", ""
            outs = [blob() for _ in range(draw(st.integers(2, 4)))]
        elif kind == "slice":
            t = "Slice"
            outs = [blob() for _ in range(draw(st.integers(2, 4)))]
            params = f"-23300={len(outs)}," + ",".join(["-233"] * len(outs)) + \
                f" 1={draw(st.integers(-1, 2))}"
        elif kind == "reshape":
            t = "Reshape"
            params = draw(st.sampled_from(['6="16,4,0h"', "0=-1 1=8", "0=4 6=\"0w,-1\"", "0=-1 12=233 13=233"]))
            outs = [blob()]
        elif kind == "gemm":
            t = "Gemm"
            params = (f"0={pnnx_float(draw(FLOAT))} 10=-1 2=0 3=1 4=0 5=0 6=1 7=0 8=0 9=0")
            outs = [blob()]
        elif kind == "crop":
            t = "Crop"
            a = draw(st.integers(-5, 5))
            params = f"-23310=1,{a} -23311=1,-1 -23309=1,0"
            outs = [blob()]
        else:
            t = "Reduction"
            params = f"0={draw(st.integers(0, 10))} 1=0 2={pnnx_float(draw(FLOAT))} -23303=1,-1 4=1 5=1"
            outs = [blob()]
        layers.append((t, name, picks, outs, params))
        avail.extend(outs)
    return layers


@st.composite
def layouts(draw):
    return {"sep": draw(st.sampled_from([" ", "  ", "\t", " \t "])),
            "eol": draw(st.sampled_from(["\n", "\r\n", "\r"])),
            "pad": draw(st.booleans()), "final_eol": draw(st.booleans()),
            "blank": draw(st.booleans())}


def render(layers, layout):
    sep, eol = layout["sep"], layout["eol"]
    blobs = {b for l in layers for b in l[2] + l[3]}
    rows = []
    for t, name, ins, outs, params in layers:
        head = f"{t:<24} {name:<24}" if layout["pad"] else f"{t}{sep}{name}"
        row = sep.join([head, str(len(ins)), str(len(outs))] + ins + outs + ([params] if params else []))
        rows.append(row)
    text = f"7767517{eol}{len(layers)} {len(blobs)}{eol}"
    if layout["blank"]:
        text += eol
    text += eol.join(rows)
    return text + (eol if layout["final_eol"] else "")


def structure(g):
    return [(l.type, l.name, l.inputs, l.outputs, dict(l.params.values_typed())) for l in g]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), layouts())
def test_random_graph_round_trips_in_any_layout(layers, layout):
    text = render(layers, layout)
    g = paramsurgery.loads(text)
    assert dump_bytes(g) == text.encode()
    # structure only: random params break layers' run-time contracts (PS113/PS114) at will
    assert not [f for f in validate(g) if f.severity == ERROR and f.code not in ("PS113", "PS114")]
    again = paramsurgery.loads(dumps(g))
    assert structure(again) == structure(g)
    # the normalised form is the same graph too, and ncnn reads it
    from paramsurgery.formats.normalize import normalize

    canon = normalize(paramsurgery.loads(text))
    assert structure(paramsurgery.loads(dumps(canon))) == structure(g)
    assert ncnn_loads(dumps(canon)) == 0


EDITS = st.lists(st.tuples(st.sampled_from(["insert_after", "insert_before", "bypass",
                                            "fanout", "rename", "setparam", "remove_dead",
                                            "move"]),
                           st.integers(0, 10_000)), min_size=1, max_size=12)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), EDITS)
def test_random_edits_keep_the_graph_loadable(layers, edits):
    g = paramsurgery.loads(render(layers, {"sep": " ", "eol": "\n", "pad": True,
                                           "final_eol": True, "blank": False}))
    # random params may break a layer's run-time contract (PS113/PS114) from the start;
    # the edits must not add one
    broken = {(f.code, f.layer) for f in validate(g) if f.code in ("PS113", "PS114")}
    for n, (op, r) in enumerate(edits):
        body = [l for l in g if l.type != "Input"]
        if not body:
            break
        target = body[r % len(body)]
        if op == "insert_after" and target.outputs:
            g.insert_after(target, "ReLU", f"ins_a{n}", slot=r % len(target.outputs))
        elif op == "insert_before" and target.inputs:
            g.insert_before(target, "Sigmoid", f"ins_b{n}", slot=r % len(target.inputs))
        elif op == "bypass" and len(target.inputs) == 1 and len(target.outputs) == 1:
            g.bypass(target)
        elif op == "fanout" and target.outputs:
            g.add_layer("TanH", f"extra{n}", [target.outputs[0]], [g.unique_blob_name(f"e{n}")])
        elif op == "rename" and target.outputs:
            g.rename_blob(target.outputs[0], g.unique_blob_name(f"renamed{n}"))
        elif op == "setparam" and target.type in ("ReLU", "BinaryOp"):
            target.set(0, r / 7) if target.type == "ReLU" else target.set(2, r)  # float params
        elif op == "remove_dead":
            g.remove_dead([target])
        elif op == "move":
            g.move_after(target, None)
            g.toposort()
    g.insert_splits()
    errs = [f for f in validate(g) if f.severity == ERROR and (f.code, f.layer) not in broken]
    assert not errs, errs
    text = dumps(g)
    assert ncnn_loads(text) == 0
    assert structure(paramsurgery.loads(text)) == structure(g)
