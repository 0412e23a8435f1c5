"""One knowledge base of ncnn's run-time contracts (paramsurgery/analysis/contracts.py):
every check set-param or a pass's `requires` makes before it edits is a validate/lint
finding too, so a graph built by hand is judged like one edited by a command."""

import ast
import inspect
import textwrap

import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.analysis.contracts import arity_problem, cache_tops, param_problem
from paramsurgery.cli import main
from paramsurgery.lint import get_rule, lint_graph
from paramsurgery.passes.base import Pass, all_passes
from paramsurgery.passes.set_param import SetParam

from conftest import FIXTURES

DECODER = FIXTURES / "qwen3_tts" / "tiny" / "talker_decoder.ported.ncnn.param"


def graph(body: str, name: str = "m.param"):
    lines = [ln for ln in textwrap.dedent(body).strip().splitlines()]
    return paramsurgery.loads("7767517\n%d 99\n%s\n" % (len(lines), "\n".join(lines)), name)


def codes_on(g, layer: str, *, run: bool = False, **kw) -> set[str]:
    """The codes validate and lint give the layer (lint without ncnn runs unless asked)."""
    found = {f.code for f in lint_graph(g, run=run, **kw) if f.layer == layer}
    return found


# ---------------------------------------------------------------- README's example

def test_readme_sdpa_kv_cache_example_is_an_error_in_validate_and_lint(tmp_path, capsys):
    g = paramsurgery.load(DECODER)
    sdpas = [layer.name for layer in g.by_type("SDPA")]
    assert sdpas and not [f for f in paramsurgery.validate(g) if f.severity == "error"]
    for layer in g.by_type("SDPA"):
        layer.set(7, 1)
    errors = [f for f in paramsurgery.validate(g) if f.severity == "error"]
    assert {f.layer for f in errors if f.code == "PS113"} == set(sdpas)
    assert "reads 6 bottoms and writes 3 tops, but it has 4 and 1" in errors[0].message
    assert {f.layer for f in lint_graph(g, run=False) if f.code == "PS113"} == set(sdpas)
    out = tmp_path / "decoder.param"
    paramsurgery.save(g, out)
    assert main(["lint", "--no-run", str(out)]) == 1
    text = capsys.readouterr().out
    assert f"PS113 error layer {sdpas[0]!r}: SDPA with 5=1 7=1" in text
    # the command refuses the very same edit, with the same words
    with pytest.raises(PassRefused, match="SDPA with 5=1 7=1 reads 6 bottoms and writes 3 tops"):
        SetParam(["7=1"], types=["SDPA"])(paramsurgery.load(DECODER))


# ---------------------------------------------------------------- the refusal walk

SDPA = """
    Input in0 0 3 q k v
    SDPA sdpa_0 3 1 q k v out
"""
MHA = """
    Input in0 0 1 x
    MultiHeadAttention mha_0 1 1 x y 0=4 1=2 2=16
"""
BINOP = """
    Input in0 0 1 x
    BinaryOp add_0 1 1 x y 0=0 1=1 2=1.0
"""
RESHAPE = """
    Input in0 0 1 x
    Reshape reshape_0 1 1 x y 0=-1 1=4
"""
CROP = """
    Input in0 0 1 x
    Crop crop_0 1 1 x y -23309=1,0 -23310=1,2 -23311=1,0
"""
SOFTMAX = """
    Input in0 0 1 x
    Softmax softmax_0 1 1 x y 0=1 1=1
"""
GEMM = """
    Input in0 0 1 x
    Gemm gemm_0 1 1 x y 4=1 5=0 7=4 8=0 9=3
"""
CONV = """
    Input in0 0 1 x
    Convolution conv_0 1 1 x y 0=4 1=1 5=0 6=16
"""


def _set(g, layer, pid, text):
    """The hand edit: the param written as the text would be (`loads` of the edited line),
    since Layer.set itself refuses a value of the wrong kind."""
    src = paramsurgery.dumps(g).replace(f" {layer} ", f" {layer} ", 1)
    lines = src.splitlines()
    i = next(i for i, ln in enumerate(lines) if f" {layer} " in ln)
    lines[i] += f" {pid}={text}"
    return paramsurgery.loads("\n".join(lines) + "\n", "m.param")


def _with_bin(tmp_path, body):
    from paramsurgery.formats.weights.synth import write_synth_bin

    g = graph(body)
    param, binp = tmp_path / "w.param", tmp_path / "w.bin"
    paramsurgery.save(g, param)
    with open(binp, "wb") as fh:
        write_synth_bin(g, fh)
    return param, binp


# (id, graph, set-param assignments, refusal regex, hand-built graph, code, layer)
CASES = [
    ("sdpa-kv-cache", SDPA, ["kv_cache=1"], "SDPA with 5=0 7=1 reads 5 bottoms",
     lambda g: g.layer("sdpa_0").set(7, 1) and g, "PS113", "sdpa_0"),
    ("sdpa-mask", SDPA, ["5=1"], "SDPA with 5=1 7=0 reads 4 bottoms",
     lambda g: g.layer("sdpa_0").set(5, 1) and g, "PS113", "sdpa_0"),
    ("mha-kv-cache", MHA, ["7=1"], "MultiHeadAttention with 5=0 7=1 reads 3 to 5 bottoms",
     lambda g: g.layer("mha_0").set(7, 1) and g, "PS113", "mha_0"),
    ("binaryop-scalar", BINOP, ["with_scalar=0"], "BinaryOp with 1=0 reads 2 bottoms",
     lambda g: g.layer("add_0").set(1, 0) and g, "PS113", "add_0"),
    ("reshape-two-inferred", RESHAPE, ["1=-1"], "infers 2 dims",
     lambda g: g.layer("reshape_0").set(1, -1) and g, "PS114", "reshape_0"),
    ("crop-short-arrays", CROP, ["axes=0,1"], r"starts \(9\) has 1 element",
     lambda g: g.layer("crop_0").set(11, [0, 1]) and g, "PS114", "crop_0"),
    ("int-kind", BINOP, ["op_type=1.5"], "int param, but 1.5 is not an integer",
     lambda g: _set(g, "add_0", 0, "1.5"), "PS011", "add_0"),
    ("scalar-given-list", BINOP, ["op_type=1,2"], "int param, but the value is a list",
     lambda g: _set(g, "add_0", 0, "1,2"), "PS011", "add_0"),
    ("unread-param", BINOP, ["9=1"], "BinaryOp does not read param 9",
     lambda g: _set(g, "add_0", 9, "1"), "PS013", "add_0"),
    ("load-param-rejects", SOFTMAX, ["1=0"], "ncnn's load_param rejects layer 'softmax_0'",
     lambda g: g.layer("softmax_0").set(1, 0) and g, "PS012", "softmax_0"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refusal_walk_set_param(case):
    _, body, assign, refusal, hand, code, layer = case
    with pytest.raises(PassRefused, match=refusal):
        SetParam(assign, layers=[layer])(graph(body))
    g = hand(graph(body))
    assert code in codes_on(g, layer), (code, lint_graph(g, run=False))
    if code in ("PS113", "PS114"):  # structural: validate itself says it
        assert code in {f.code for f in paramsurgery.validate(g) if f.layer == layer}


def test_refusal_walk_bin_layout_and_gemm_constants(tmp_path):
    # set-param refuses an edit that changes what a layer reads from the .bin ...
    param, binp = _with_bin(tmp_path, CONV)
    with pytest.raises(PassRefused, match="changes what it reads from the .bin"):
        SetParam(["bias_term=1"], layers=["conv_0"])(paramsurgery.load(param, bin=binp))
    # ... and lint with that .bin finds the same edit made by hand
    g = paramsurgery.load(param)
    g.layer("conv_0").set(5, 1)
    assert "PS201" in codes_on(g, "conv_0", bin=binp)
    # a Gemm's constant A sized to nothing: refused (it changes the .bin), and by hand PS012
    param, binp = _with_bin(tmp_path, GEMM)
    with pytest.raises(PassRefused, match="changes what it reads from the .bin"):
        SetParam(["7=0"], layers=["gemm_0"])(paramsurgery.load(param, bin=binp))
    g = paramsurgery.load(param)
    g.layer("gemm_0").set(7, 0)
    assert "PS012" in codes_on(g, "gemm_0")


# Every refusal site of set-param and of each pass's `requires`: either a contract of ncnn
# (walked above: the key names the CASES id or test that shows the finding) or a refusal
# about the command's own arguments or the rewrite's preconditions (no graph to judge).
CONTRACT = {
    ("typed_value", "param, but the value is a list"): "scalar-given-list",
    ("typed_value", "int param, but {} is not an integer (ncnn"): "int-kind",
    ("typed_value", "param, but {} is not an integer"): "int-kind",
    ("typed_value", "param, but {} is an array key"): "scalar-given-list",
    ("typed_value", "does not read param"): "unread-param",
    ("apply_params", "does not read param"): "unread-param",
    ("_edit", "does not read param"): "unread-param",
    ("check_loads", "load_param rejects"): "load-param-rejects",
    ("_edit", "changes what it reads from the .bin"): "bin-layout",
    ("_edit", "ncnn would crash at run time"): "sdpa-kv-cache",
}
NOT_A_GRAPH = {
    ("resolve_key", "out of range"): "an id no .param can hold (the reader refuses it)",
    ("resolve_key", "has no param named"): "a misspelt name on the command line",
    ("_numbers", "is not a number"): "a value the command line cannot parse",
    ("_numbers", "element"): "a value the command line cannot parse",
    ("typed_value", "missing value"): "an empty assignment on the command line",
    ("typed_value", "{}: {}"): "a value the command line cannot parse (Str/Float/Int)",
    ("split_assignment", "expected ID=VALUE"): "command-line syntax",
    ("__post_init__", "say which layers"): "command-line selection",
    ("__post_init__", "nothing to set"): "command-line selection",
    ("_targets", "no layer named"): "command-line selection",
    ("_targets", "no layer of type"): "command-line selection",
    ("run", "no selected layer matches"): "command-line selection",
    ("_edit", "layer {}: {}"): "re-raises the refusals above with the layer's name",
    ("requires", "already streams"): "add-conv-cache's precondition (done already)",
    ("requires", "has no Convolution1D"): "add-conv-cache's precondition (nothing to do)",
    ("requires", "cannot stream"): "add-conv-cache's precondition (timeflow analysis)",
    ("requires", "no rule given"): "rewrite's command-line argument",
    ("requires", "names no layer of the graph"): "keep-precision's command-line selection",
    ("requires", "--keep names no layer"): "quantize-int8's command-line selection",
}


def _refusal_sites():
    """(function, message template) of every PassRefused raised in set_param.py and in the
    `requires` of every registered pass."""
    import paramsurgery.passes.set_param as sp

    def sites(tree, funcs=None):
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or (funcs and node.name not in funcs):
                continue
            for n in ast.walk(node):
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "PassRefused" \
                        and n.args:
                    a = n.args[0]
                    parts = a.values if isinstance(a, ast.JoinedStr) else [a]
                    text = "".join(p.value if isinstance(p, ast.Constant) else "{}"
                                   for p in parts) if isinstance(a, (ast.JoinedStr,
                                                                     ast.Constant)) \
                        else ast.unparse(a)
                    yield node.name, text

    out = list(sites(ast.parse(inspect.getsource(sp))))
    for cls in all_passes().values():
        if cls.requires is not Pass.requires:
            src = textwrap.dedent(inspect.getsource(cls.requires))
            out += list(sites(ast.parse(src), {"requires"}))
    return out


def test_every_refusal_is_walked_or_is_not_about_a_graph():
    walked = {c[0] for c in CASES} | {"bin-layout"}
    known = {**CONTRACT, **NOT_A_GRAPH}
    sites = _refusal_sites()
    assert len(sites) > 20
    for func, text in sites:
        keys = [k for k in known if k[0] == func and k[1] in text]
        assert keys, f"refusal in {func}() not classified: {text!r} (add a CASES entry " \
                     f"and a validate/lint rule if it is a contract of ncnn)"
        for k in keys:
            if k in CONTRACT:
                assert CONTRACT[k] in walked


# ---------------------------------------------------------------- the table itself

def test_arity_table_follows_ncnn():
    g = graph("""
        Input in0 0 6 q k v m pk pv
        SDPA s1 4 1 q k v m out1 5=1
        SDPA s2 6 3 q k v m pk pv out2 ok ov 5=1 7=1
        MultiHeadAttention h1 1 1 q o1 0=4 1=2 2=16
        MultiHeadAttention h2 3 1 q k v o2 0=4 1=2 2=16
        MultiHeadAttention h3 4 1 q k v m o3 0=4 1=2 2=16
        MultiHeadAttention h4 4 3 q m pk pv o4 ok4 ov4 0=4 1=2 2=16 5=1 7=1
        Gemm g1 2 1 q k o5
        Gemm g2 3 1 q k v o6
        Gemm g3 1 1 q o7 4=0 5=1 7=0 8=4 9=3
        Gemm g4 4 1 q k v m o8
    """)
    bad = {layer.name for layer in g if arity_problem(layer)}
    assert bad == {"h3", "g4"}
    assert cache_tops(g.layer("s2")) == ["ok", "ov"] and cache_tops(g.layer("s1")) == []


def test_param_consistency():
    g = graph("""
        Input in0 0 1 x
        Reshape r1 1 1 x a 0=-1 1=-1
        Reshape r2 1 1 x b 6="0w,-1"
        Crop c1 1 1 x c -23309=2,0,0 -23310=1,3 -23311=2,0,1
        Crop c2 1 1 x d -23309=1,0 -23310=1,3 -23311=1,1
        Crop c3 1 1 x e -23309=2,0,1 -23310=1,3
    """)
    assert {layer.name for layer in g if param_problem(layer)} == {"r1", "c1", "c3"}


def test_layer_set_refuses_values_of_the_wrong_kind():
    g = graph(BINOP)
    layer = g.layer("add_0")
    for bad in ("abc", [1, 2], 1.5):
        with pytest.raises(TypeError, match="param is an int"):
            layer.set(0, bad)
    with pytest.raises(TypeError, match="param is a float"):
        layer.set(2, "x")
    c = graph(CROP).layer("crop_0")
    with pytest.raises(TypeError, match="param is an int array"):
        c.set(11, 3)
    assert layer.params.get(0) == 0 and c.params.get(11) == [0]


def test_ps111_quiet_on_native_kv_cache_outputs():
    from paramsurgery.passes.kvcache import AddKVCache

    g = AddKVCache()(paramsurgery.load(DECODER)).graph
    assert not [f for f in lint_graph(g, run=False, select="PS111")]
    # an unread input is still reported
    g2 = graph("""
        Input in0 0 4 q k v unused
        SDPA s 3 1 q k v out
    """)
    assert [f.layer for f in lint_graph(g2, run=False, select="PS111")] == ["in0"]


def test_explain_and_list_show_every_severity_the_findings_carry(capsys):
    rule = get_rule("PS111")
    assert rule.severities == ("warning", "info")
    assert main(["lint", "--explain", "PS111"]) == 0
    assert "[warning/info]" in capsys.readouterr().out
    assert main(["lint", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "PS111  warning/info" in listed and "PS113  error " in listed


# ---------------------------------------------------------------- runs claimed only when made

def test_lint_run_runs_at_inputshape_or_says_why_not(tmp_path, capsys):
    p = tmp_path / "m.param"
    p.write_text("7767517\n2 2\nInput in0 0 1 x\nReLU r 1 1 x y\n")
    assert main(["lint", "--run", str(p)]) == 0
    out = capsys.readouterr().out
    assert "PS400 info not run: no input shapes" in out and "All checks passed" not in out
    assert main(["lint", "--run", str(p), "--inputshape", "x=[4,T]"]) == 0
    assert "not run: --inputshape has a symbolic dim" in capsys.readouterr().out
    # with numbers the run is made: a Slice without slices crashes ncnn (PS404 says so)
    crash = tmp_path / "c.param"
    crash.write_text("7767517\n3 4\nInput in0 0 1 x\nSlice s 1 2 x a b\nConcat c 2 1 a b y\n")
    assert main(["lint", "--run", str(crash), "--inputshape", "x=[4,6]"]) == 1
    out = capsys.readouterr().out
    assert "PS404 error ncnn fails when the graph runs" in out and "not run" not in out


def test_demo_claims_only_the_runs_it_made(capsys):
    from conftest import CORPUS

    assert main(["demo", str(CORPUS / "squeezenet.param")]) == 0
    out = capsys.readouterr().out
    assert "static rules only; not run: nothing to run it at" in out
    assert "traced shapes" not in out and "all steps passed" not in out
    assert "not done: lint's ncnn run" in out and "kv-cache parity (no kv-cache graph)" in out


# ---------------------------------------------------------------- claims as data, small items

def test_claims_table_is_what_the_passes_claim():
    """lint's PS004 reads patterns/claims.py (lint may not import passes); it must say what
    the passes' own `claims` say, type for type (the first repair in fix's order wins)."""
    from paramsurgery.ir.layer import Layer
    from paramsurgery.ir.params import Params
    from paramsurgery.passes.base import repair_for
    from paramsurgery.passes.lower import default_rules
    from paramsurgery.passes.passthrough import LEFTOVERS
    from paramsurgery.patterns.claims import CLAIMS

    types = set(CLAIMS) | set(LEFTOVERS) | {"torch.unbind", "Tensor.unbind"}
    for r in default_rules():
        types |= set(r.types)
    got = {t: repair_for(Layer(t, "x", ["a"], ["b"], Params())) for t in sorted(types)}
    want = {t: p for t, p in got.items() if p is not None}
    assert CLAIMS == want, "update paramsurgery/patterns/claims.py: " + ", ".join(
        f"{t}: {want.get(t)} (table: {CLAIMS.get(t)})" for t in sorted(set(want) | set(CLAIMS))
        if want.get(t) != CLAIMS.get(t))
    g = graph("""
        Input in0 0 1 x
        Tensor.to t 1 1 x y
    """)
    assert [f.fix_pass for f in lint_graph(g, run=False) if f.code == "PS004"] == ["lower"]


def test_package_namespace_is_the_public_api():
    names = set(dir(paramsurgery))
    assert not names & {"Any", "TYPE_CHECKING", "importlib", "annotations"}
    assert {"load", "save", "validate", "Graph", "PassRefused"} <= names


def test_errors_without_a_file_carry_no_input_prefix(tmp_path, capsys):
    g = graph(BINOP)
    with pytest.raises(paramsurgery.GraphError) as info:
        g.layer("nope")
    assert str(info.value) == "no layer named 'nope'"
    assert str(paramsurgery.ParamSurgeryError("x", file="m.param", line=3)) == "m.param:3: x"


def test_a_weights_file_given_as_the_graph_says_so(tmp_path, capsys):
    param, binp = _with_bin(tmp_path, CONV)
    assert main(["info", str(binp)]) == 2
    err = capsys.readouterr().err
    assert f"{binp}: this is a weights file (.bin), not a graph" in err and "magic" not in err


def test_counts_are_singular_for_one(capsys):
    from paramsurgery.analysis.summary import format_summary, summarize

    g = graph("""
        Input in0 0 1 x
    """)
    assert ", 1 layer, 1 blob" in format_summary(summarize(g)) and "1 layer," in repr(g)
