"""Each lint rule on small hand-written graphs (static rules; no ncnn runs), and the
registry: codes, docs, fixes as data, select/ignore."""

import time

import pytest

import paramsurgery
from paramsurgery.core.findings import ERROR, INFO, WARNING
from paramsurgery.lint import LintOptions, all_rules, fix_pass_of, fixable, get_rule, lint_graph
from paramsurgery.lint.catalogue import select_rules

from conftest import ncnn_loads
from paramsurgery.analysis.validate import validate

# the pass names `paramsurgery fix` knows (issue 6 + the repair engineer's commands)
KNOWN_PASSES = {"fix-slice", "fix-reduction", "dynamize", "fold-gqa", "fuse-codebooks", "fix",
                "fix-batch-reshape", "lower", "fix-tied-linear", "fix-pow", "fix-lossy-reshape",
                "fix-bool-table"}


def graph(body: str, layers: int | None = None, blobs: int | None = None):
    lines = [ln.strip() for ln in body.strip().splitlines()]
    names = set()
    for ln in lines:
        t = ln.split()
        n_in, n_out = int(t[2]), int(t[3])
        names.update(t[4:4 + n_in + n_out])
    text = f"7767517\n{layers or len(lines)} {blobs or len(names)}\n" + "\n".join(lines) + "\n"
    return paramsurgery.loads(text, "m.param"), text


def lint(body: str, **kw):
    g, _ = graph(body)
    kw.setdefault("run", False)
    return lint_graph(g, **kw)


def only(findings, code):
    return [f for f in findings if f.code == code]


# =========================================================================== registry

def test_registry_codes_docs_and_fixes_are_data():
    rules = all_rules()
    assert len(rules) >= 35
    for code, r in rules.items():
        assert r.code == code and r.summary and r.doc, code
        assert r.severity in (ERROR, WARNING, INFO)
        assert code[:3] in ("PS0", "PS1", "PS2", "PS3", "PS4")
        if r.fix_pass is not None:
            assert r.fix_pass in KNOWN_PASSES and r.fix == f"paramsurgery {r.fix_pass}"
        text = r.explain()
        assert text.startswith(f"{code} ({r.name}) [{'/'.join(r.severities)}]") and r.doc in text
    # every code issue 6 asks for exists
    for code in ("PS001", "PS003", "PS004", "PS006", "PS007", "PS008", "PS101", "PS104", "PS105",
                 "PS106", "PS111", "PS201", "PS203", "PS204", "PS301", "PS302", "PS401",
                 "PS402", "PS403"):
        assert code in rules
    assert get_rule("ps001").fix_pass == "fix-slice"
    assert get_rule("PS006").fix_pass == "fix-reduction"
    assert get_rule("PS999") is None
    assert [c for c, r in rules.items() if not r.default] == ["PS009"]
    assert "PS009" not in {r.code for r in select_rules()}
    assert "PS009" in {r.code for r in select_rules("ALL")}


def test_select_and_ignore_prefixes():
    codes = lambda rs: {r.code for r in rs}  # noqa: E731
    assert codes(select_rules(["PS0"])) == {c for c in all_rules() if c.startswith("PS0")}
    assert codes(select_rules("PS001,PS106")) == {"PS001", "PS106"}
    assert "PS106" not in codes(select_rules(None, ["PS10"]))
    assert codes(select_rules(["PS1"], ["PS107"])) == \
        {c for c in all_rules() if c.startswith("PS1")} - {"PS107"}
    with pytest.raises(ValueError, match="PS9"):
        select_rules(["PS9"])
    fs = lint("""Input in 0 1 a
                 Slice s 1 2 a b c""", select=["PS001"])
    assert [f.code for f in fs] == ["PS001"]
    assert lint("""Input in 0 1 a
                   Slice s 1 2 a b c""", ignore=["PS0"]) == []


# =========================================================================== PS0xx

def test_ps001_paramless_slice():
    fs = lint("""Input in 0 1 a
                 Slice unbind_0 1 3 a b c d
                 Slice ok 1 2 b e f -23300=2,-233,-233 1=0
                 Slice empty 1 2 c g h -23300=0""")
    hits = only(fs, "PS001")
    assert [f.layer for f in hits] == ["unbind_0", "empty"]
    f = hits[0]
    assert f.severity == ERROR and f.line == 4 and f.fix == "paramsurgery fix-slice"
    assert f.format() == ("m.param:4: PS001 error Slice 'unbind_0' has no slices or indices: ncnn "
                          "dereferences a null pointer at run time (SIGSEGV; pnnx wrote it for an "
                          "`unbind`/`chunk` along its batch axis) (fix: paramsurgery fix-slice)")
    assert fix_pass_of(f) == "fix-slice"


def test_ps002_short_slice():
    fs = lint("""Input in 0 1 a
                 Slice s 1 3 a b c d -23300=2,1,-233
                 Slice t 1 3 b e f g -23302=1,2
                 Slice u 1 3 c h i j -23302=2,1,2""")
    assert [f.layer for f in only(fs, "PS002")] == ["s", "t"]


def test_ps003_batch_axis():
    fs = lint("""Input in 0 1 a
                 Slice tensor_split_0 1 3 a b c d 1=-233 -23302=2,1,2
                 Concat stack_0 3 1 b c d e 0=-233
                 Reduction sum_3 1 1 e f 0=0 1=0 -23303=0 4=0 5=1
                 Crop crop 1 1 f g -23309=1,0 -23310=1,2 -23311=1,-233""")
    hits = {f.layer: f for f in only(fs, "PS003")}
    assert set(hits) == {"tensor_split_0", "stack_0", "crop"}
    assert hits["tensor_split_0"].fix == "paramsurgery fix-slice"
    assert "SIGFPE" in hits["stack_0"].message and hits["stack_0"].fix == "paramsurgery fix-reduction"
    # the wheel agrees: a Slice along -233 does not load
    assert ncnn_loads("7767517\n2 4\nInput in 0 1 a\nSlice s 1 3 a b c d 1=-233 -23302=2,1,2\n") != 0


def test_ps004_leftovers_name_the_torch_construct():
    fs = lint("""Input in 0 1 x
                 Split sp 1 2 x x1 x2
                 ExpandDims unsq 1 1 x1 k -23303=1,1
                 pnnx.Expression pnnx_expr_35 1 1 x2 sizes
                 Tensor.expand Tensor.expand_10 2 1 k sizes ke
                 Reshape reshape_7 1 1 ke kr 6="8,0h,4"
                 SDPA sdpa 3 1 kr kr kr o 5=0
                 torch.unbind torch.unbind_0 1 2 o u1 u2
                 F.scaled_dot_product_attention F.sdpa_1 3 1 u1 u2 u2 s
                 Tensor.slice Tensor.slice_1 1 1 s t
                 aten::triu triu 1 1 t v
                 prim::TupleConstruct tup 1 1 v w
                 torch.gt gt 1 1 w out0""")
    hits = {f.layer: f for f in only(fs, "PS004")}
    assert set(hits) == {"pnnx_expr_35", "Tensor.expand_10", "torch.unbind_0", "F.sdpa_1",
                         "Tensor.slice_1", "triu", "tup", "gt"}
    assert all(f.severity == ERROR for f in hits.values())
    assert "repeat_kv" in hits["pnnx_expr_35"].message
    assert hits["pnnx_expr_35"].fix == hits["Tensor.expand_10"].fix == "paramsurgery fold-gqa"
    assert "not exists or registered" in hits["Tensor.expand_10"].message
    assert "batch axis" in hits["torch.unbind_0"].message
    assert "is_causal=True" in hits["F.sdpa_1"].message
    assert "M-RoPE" in hits["Tensor.slice_1"].message
    assert "mask" in hits["triu"].message and "tracing" in hits["tup"].message
    assert "boolean mask" in hits["gt"].message
    assert hits["gt"].fix == "paramsurgery lower"  # integer comparisons: lower_masks


def test_ps004_pad_and_expand_without_attention():
    fs = lint("""Input in 0 1 x
                 Split sp 1 3 x x1 x2 x3
                 pnnx.Expression pnnx_expr_0 1 1 x1 p
                 F.pad F.pad_1 2 1 x2 p y
                 pnnx.Expression pnnx_expr_1 1 1 x3 s
                 Tensor.expand Tensor.expand_0 2 1 y s out0""")
    hits = {f.layer: f.message for f in only(fs, "PS004")}
    assert "math.ceil" in hits["pnnx_expr_0"] and "math.ceil" in hits["F.pad_1"]
    # an expand that does not feed attention is not repeat_kv
    assert "repeat_kv" not in hits["Tensor.expand_0"]
    assert "dynamic shape" in hits["Tensor.expand_0"]


def test_ps005_custom_layer():
    fs = lint("""Input in 0 1 a
                 MyLayer m 1 1 a b""")
    assert [(f.code, f.severity) for f in fs] == [("PS005", ERROR)]
    assert "register_custom_layer" in fs[0].message


def test_ps006_reduction_that_reduces_nothing():
    fs = lint("""Input in 0 1 a
                 Split sp 1 4 a a1 a2 a3 a4
                 Reduction r_empty 1 1 a1 b 0=0 1=0 -23303=0 4=0 5=1
                 Reduction r_absent 1 1 a2 c 0=3 1=0
                 Reduction r_all 1 1 a3 d 0=0
                 Reduction r_axes 1 1 a4 e 0=0 1=0 -23303=1,1 4=0 5=1""")
    hits = only(fs, "PS006")
    assert [f.layer for f in hits] == ["r_empty", "r_absent"]
    assert hits[0].fix == "paramsurgery fix-reduction"


def test_ps007_float_math_on_ids():
    fs = lint("""Input in 0 1 ids
                 Split sp 1 3 ids i1 i2 i3
                 BinaryOp add_0 1 1 i1 a 0=0 1=1 2=5.0
                 Embed e0 1 1 a o0 0=8 1=32 2=0 3=256
                 Reshape r 1 1 i2 b 0=-1
                 Clip clamp_1 1 1 b c 0=0.0 1=31.0
                 Embed e1 1 1 c o1 0=8 1=32 2=0 3=256
                 Reshape ok 1 1 i3 d 0=-1
                 Embed e2 1 1 d o2 0=8 1=32 2=0 3=256""")
    hits = {f.layer: f for f in only(fs, "PS007")}
    assert set(hits) == {"add_0", "clamp_1"}
    assert "add 5.0" in hits["add_0"].message and "e0" in hits["add_0"].message
    assert "clamp(0.0, 31.0)" in hits["clamp_1"].message


def test_ps008_ps009_batch_axis_reshapes():
    body = """Input in 0 1 a
              Reshape into 1 1 a b 12=233 13=0 6="8,0h"
              Reshape stays 1 1 b c 12=0 13=0 6="0w,0n"
              Reshape outof 1 1 c d 12=0 13=233 6="0n" """
    fs = lint(body)
    assert [(f.layer, f.severity) for f in only(fs, "PS008")] == [("into", INFO)]
    assert "batch_index=0" in only(fs, "PS008")[0].message
    # a layer computing along an axis reads the batched data: the case-7 bug
    mixed = lint("""Input in 0 1 ids
                    MemoryData ones 0 1 w 0=3
                    Embed e 1 1 ids a 0=8 1=96 3=768
                    Reshape into 1 1 a b 12=233 13=0 6="//(*(8,0h),3),3"
                    MatMul matmul_4 2 1 w b c
                    Reshape r 1 1 c out0 6="8,//(0w,8)" """)
    f = only(mixed, "PS008")[0]
    assert f.severity == WARNING and "MatMul 'matmul_4'" in f.message
    assert only(fs, "PS009") == []  # off by default: the targeted ncnn has PR #6784
    info = only(lint(body, select=["PS0"]), "PS009")
    assert len(info) == 1 and info[0].severity == INFO and "3 Reshape" in info[0].message


def test_ps010_rope_from_graph_input():
    fs = lint("""Input in0 0 1 q
                 Input in1 0 1 cos
                 Input in2 0 1 sin
                 RotaryEmbed rope_0 3 1 q cos sin r 0=0
                 Permute p 1 1 r s 0=2
                 RotaryEmbed rope_1 3 1 s cos sin out0 0=0""")
    assert [f.layer for f in only(fs, "PS010")] == ["rope_0"]


def test_ps011_param_kinds():
    fs = lint("""Input in 0 1 a
                 BinaryOp b 1 1 a b1 0=2.0 1=1 2=3.0
                 Clip c 1 1 b1 c1 0=0 1=6
                 Slice s 1 2 c1 d e 2=4
                 Crop cr 1 1 d f 19=1 20="2" 21="0"
                 Eltwise el 2 1 e f g 0=1 -23301=2,1.0,2
                 ReLU r 1 1 g h 0=0.1 0=0.2""")
    hits = {(f.layer, f.severity) for f in only(fs, "PS011")}
    assert ("b", ERROR) in hits            # float op_type: the wheel reads the default (ADD)
    assert ("c", WARNING) in hits          # 1=6 (int for float); 0=0 has the bits of 0.0
    assert sum(1 for f in only(fs, "PS011") if f.layer == "c") == 1
    assert ("s", ERROR) in hits            # scalar where an array is read
    assert ("cr", ERROR) in hits           # number where a string is read
    assert ("el", ERROR) in hits           # mixed int/float array
    assert ("r", WARNING) in hits          # duplicate id
    msg = next(f.message for f in only(fs, "PS011") if f.layer == "b")
    assert "0 (op_type) is written as float 2.0" in msg


def test_ps011_float_bit_patterns_are_explained():
    fs = lint("""Input in 0 1 a
                 Yolov3DetectionOutput d 1 1 a b 0=1 -23305=2,1077936128,1082130432""")
    f = only(fs, "PS011")[0]
    assert f.severity == WARNING and "float32 bit patterns (3, 4" in f.message


def test_ps012_params_ncnn_rejects_agree_with_the_wheel():
    cases = {
        "Reduction r 1 1 a b 0=0 1=0 -23303=1,0 4=0": "has axes but no 5=1",
        "Softmax r 1 1 a b 0=1": "no 1=1",
        "MultiHeadAttention r 1 1 a b 0=10 1=3 2=100": "not a multiple of num_heads",
        "GroupNorm r 1 1 a b 0=3 1=8 2=0.001 3=0": "not a multiple",
        "Gemm r 1 1 a b 4=1 7=0 9=4": "constant A",
    }
    for line, why in cases.items():
        fs = lint(f"Input in 0 1 a\n{line}", select=["PS012"])
        assert len(fs) == 1 and why in fs[0].message, line
        assert ncnn_loads(f"7767517\n2 2\nInput in 0 1 a\n{line}\n") != 0, line
    ok = "Reduction r 1 1 a b 0=0 1=0 -23303=1,0 4=0 5=1"
    assert lint(f"Input in 0 1 a\n{ok}", select=["PS012"]) == []
    assert ncnn_loads(f"7767517\n2 2\nInput in 0 1 a\n{ok}\n") == 0
    fs = lint("""Input in 0 1 a
                 Crop c 1 1 a b 19="0" 20="//(0w,2)" """, select=["PS012"])
    assert len(fs) == 1 and "axes (21)" in fs[0].message


def test_ps013_unread_params_are_info():
    fs = lint("""Input in 0 1 a
                 Convolution1D c 1 1 a b 0=4 1=3 6=48 7=1""")
    assert [(f.code, f.severity) for f in fs] == [("PS013", INFO)]


# =========================================================================== PS1xx

def test_structure_rules_reuse_validate():
    fs = lint("""Input in 0 1 a
                 ReLU r 1 1 a b
                 ReLU s 1 1 a c
                 ReLU t 1 1 zz d""")
    by = {f.code: f for f in fs}
    assert by["PS106"].fix == "Graph.insert_splits()" and by["PS106"].severity == ERROR
    assert by["PS104"].layer == "t"
    g, _ = graph("""Input in 0 1 a
                    ReLU r 1 1 a b""")
    assert [f.code for f in validate(g)] == [f.code for f in lint_graph(g, select="PS1",
                                                                         ignore="PS111")]


def test_ps111_unused_blobs():
    fs = lint("""Input in0 0 1 a
                 Input in1 0 1 unused
                 Slice s 1 2 a b c -23300=2,-233,-233 1=0
                 ReLU dead 1 1 b x
                 ReLU r 1 1 b out0""")
    hits = {(f.layer, f.severity) for f in only(fs, "PS111")}
    assert ("in1", WARNING) in hits          # an input nobody reads
    assert ("s", INFO) in hits               # a discarded Slice part
    assert ("dead", WARNING) in hits         # a dead branch in a pnnx-named graph
    assert ("r", WARNING) not in hits and ("r", INFO) not in hits
    # without pnnx's out0 naming an unread blob is just an output
    fs = lint("""Input in 0 1 a
                 ReLU r 1 1 a prob""")
    assert only(fs, "PS111") == []


# =========================================================================== PS2xx

def test_ps203_weight_data_size():
    fs = lint("""Input in 0 1 a
                 Convolution c0 1 1 a b 0=8 1=3 11=3 6=216
                 ReLU r 1 1 b c
                 Convolution c1 1 1 c d 0=4 1=1 6=40
                 Convolution c2 1 1 d e 0=4 1=3 6=100
                 Embed e 1 1 e f 0=8 1=32 3=255
                 InnerProduct ip 1 1 f g 0=10 2=15""")
    hits = {f.layer: f.message for f in only(fs, "PS203")}
    assert set(hits) == {"c1", "c2", "e", "ip"}
    assert "Convolution 'c0' gives 8 channels" in hits["c1"]
    assert "not a multiple" in hits["c2"]


def test_ps201_ps202_bin_accounting(tmp_path):
    from conftest import FIXTURES

    d = FIXTURES / "repros" / "uneven-chunk" / "bug"
    param = d / "model.ncnn.param"
    good = (d / "model.ncnn.bin").read_bytes()
    g = paramsurgery.load(param)
    assert lint_graph(g, bin=d / "model.ncnn.bin", select="PS2") == []
    short = tmp_path / "short.bin"
    short.write_bytes(good[:100])
    fs = lint_graph(g, bin=short, select="PS2")
    assert [(f.code, f.layer, f.line) for f in fs] == [("PS201", "conv1d_0", 4)]
    assert "file ends" in fs[0].message
    long = tmp_path / "long.bin"
    long.write_bytes(good + b"\0" * 8)
    fs = lint_graph(g, bin=long, select="PS2")
    assert [(f.code, f.severity) for f in fs] == [("PS202", WARNING)]
    assert "8 bytes left" in fs[0].message
    assert g.weights is None  # the caller's graph is not touched


def test_ps204_layer_without_schema_before_weights(tmp_path):
    g, _ = graph("""Input in 0 1 a
                    MyLayer m 1 1 a b
                    InnerProduct ip 1 1 b c 0=2 1=0 2=4""")
    b = tmp_path / "m.bin"
    b.write_bytes(b"\0" * 4 + b"\0" * 16)
    fs = lint_graph(g, bin=b, select="PS204")
    assert [(f.code, f.layer) for f in fs] == [("PS204", "m")]


# =========================================================================== PS3xx

def test_scale_hazards_with_small_limits():
    body = "Input in 0 1 b0\n" + "\n".join(f"ReLU r{i} 1 1 b{i} b{i + 1}" for i in range(50))
    g, _ = graph(body)
    opts = LintOptions(depth_limit=40, blob_limit=30, run=False)
    fs = lint_graph(g, options=opts, select="PS3")
    assert {(f.code, f.severity) for f in fs} == {("PS301", WARNING), ("PS302", WARNING)}
    assert "51 layers" in fs[0].message or "51 layers" in fs[1].message
    assert lint_graph(g, select="PS3", run=False) == []


def test_lint_is_linear_in_graph_size():
    def chain(n):
        body = ["Input in 0 1 b0"]
        for i in range(n):
            body.append(f"Split s{i} 1 2 b{i} x{i} y{i}")
            body.append(f"BinaryOp a{i} 2 1 x{i} y{i} b{i + 1} 0=0")
        text = f"7767517\n{len(body)} {3 * n + 1}\n" + "\n".join(body) + "\n"
        return paramsurgery.loads(text, "chain.param")

    def timed(n):
        g = chain(n)
        t = time.process_time()  # CPU time: wall time also counts other processes' load
        lint_graph(g, run=False)
        return time.process_time() - t

    timed(500)
    small, big = min(timed(4000) for _ in range(2)), min(timed(16000) for _ in range(2))
    assert big < 8 * small + 0.05, (small, big)  # 4x the layers: ~4x the time, not 16x


def test_fixable_groups_findings_by_pass():
    fs = lint("""Input in 0 1 a
                 Slice s 1 2 a b c
                 Reduction r 1 1 b d 0=0 1=0""")
    groups = fixable(fs)
    assert {k: [f.code for f in v] for k, v in groups.items()} == \
        {"fix-slice": ["PS001"], "fix-reduction": ["PS006"]}


def test_ps014_separate_codebook_embeds():
    body = ["Input in0 0 1 i0", "Input in1 0 1 i1", "Input in2 0 1 i2"]
    body += [f"Embed e{k} 1 1 i{k} x{k} 0=8 1=32 3=256" for k in range(3)]
    body += ["BinaryOp add_0 2 1 x0 x1 s0 0=0", "BinaryOp add_1 2 1 s0 x2 out0 0=0"]
    fs = lint("\n".join(body))
    assert [(f.code, f.layer, f.severity, f.fix) for f in fs] == \
        [("PS014", "add_1", INFO, "paramsurgery fuse-codebooks")]
    assert "3 Embed tables" in fs[0].message
    # one Embed, or Embeds over computed ids, are not codebooks to fuse
    assert lint("\n".join(body[:4] + ["BinaryOp add_0 2 1 x0 x0 out0 0=0"]), select="PS014") == []
