"""lower's length-mask rules (lower_masks.py) and the thaw of constants pnnx folded at the
traced length (frozen_extent.py) on small hand-written graphs: golden text, ncnn numbers
at a length no trace used against numpy, refusals with their reasons."""

from __future__ import annotations

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.lower import RULES, Lower
from paramsurgery.runtime.child import Feed, Fetch, run

from golden import check_golden
from test_lower_layout import fix_header
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps


def lower_with_bin(tmp_path, ncnn: str, pnnx: str, weights: bytes = b"", *,
                   script: str | None = None, **kw):  # noqa: ANN201 - PassResult
    param = tmp_path / "m.ncnn.param"
    param.write_text(fix_header(ncnn))
    (tmp_path / "m.ncnn.bin").write_bytes(weights)
    (tmp_path / "m.pnnx.param").write_text(pnnx)
    if script is not None:
        (tmp_path / "m_ncnn.py").write_text(script)
    g = paramsurgery.load(param, bin=tmp_path / "m.ncnn.bin")
    return Lower(traced=tmp_path / "m.pnnx.param", **kw)(g)


def run_saved(tmp_path, res, x: np.ndarray, batch: int = 0) -> np.ndarray:
    save(res.graph, tmp_path / "y.param", tmp_path / "y.bin")
    return run((tmp_path / "y.param").read_text(), tmp_path / "y.bin", {"in0": Feed(x, batch)},
               [Fetch("out0", batch)])["out0"]


# x * (arange(T) <op> k).float() with k a MemoryData constant (4)
CMP_NCNN = """7767517
0 0
Input in0 0 1 in0
Split sp 1 2 in0 x0 x1
pnnx.Expression pnnx_expr_0 1 1 x0 n
torch.arange torch.arange_0 1 1 n pos
MemoryData k 0 1 kk 0=1
torch.OP torch.OP_0 2 1 pos kk m
Tensor.to Tensor.to_0 1 1 m mf
BinaryOp mul_0 2 1 x1 mf out0 0=2
"""
CMP_PNNX = """7767517
8 7
pnnx.Input pnnx_input_0 0 1 0 #0=(1,?)f32
pnnx.Expression pnnx_expr_0 1 1 0 1 expr=size(@0,1) #0=(1,?)f32
torch.arange torch.arange_0 1 1 1 2 dtype=torch.float $end=1 #2=(?)f32
pnnx.Attribute k 0 1 3 @data=(1)f32 #3=(1)f32
torch.OP torch.OP_0 2 1 2 3 4 $input=2 $other=3 #2=(?)f32 #3=(1)f32 #4=(?)bool
Tensor.to Tensor.to_0 1 1 4 5 copy=False dtype=torch.float $input=4 #4=(?)bool #5=(?)f32
pnnx.Expression pnnx_expr_1 2 1 0 5 6 expr=mul(@0,@1) #0=(1,?)f32 #5=(?)f32 #6=(1,?)f32
pnnx.Output pnnx_output_0 1 0 6 #6=(1,?)f32
"""
NUMPY_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
             "eq": np.equal, "ne": np.not_equal}


@pytest.mark.parametrize("kind", list(NUMPY_CMP))
def test_integer_comparison_against_a_constant(tmp_path, kind: str) -> None:
    res = lower_with_bin(tmp_path, CMP_NCNN.replace("OP", kind), CMP_PNNX.replace("OP", kind),
                         np.float32([4]).tobytes())
    if kind in ("lt", "eq"):
        check_golden(f"lower_masks/compare_{kind}.param", dumps(res.graph))
    x = np.random.default_rng(6).standard_normal((1, 9)).astype(np.float32)  # traced: none
    want = x * NUMPY_CMP[kind](np.arange(9), 4).astype(np.float32)
    got = run_saved(tmp_path, res, x)
    assert np.array_equal(got.reshape(want.shape), want)


def test_comparison_of_a_float_input_is_refused(tmp_path) -> None:
    ncnn = CMP_NCNN.replace("OP", "lt").replace("torch.lt_0 2 1 pos kk m",
                                                 "torch.lt_0 2 1 x0 kk m")
    ncnn = ncnn.replace("pnnx.Expression pnnx_expr_0 1 1 x0 n\n", "").replace(
        "torch.arange torch.arange_0 1 1 n pos\n", "")
    pnnx = CMP_PNNX.replace("OP", "lt").replace("$input=2 $other=3 #2=(?)f32",
                                                "$input=0 $other=3 #0=(1,?)f32")
    pnnx = pnnx.replace("torch.lt torch.lt_0 2 1 2 3 4", "torch.lt torch.lt_0 2 1 0 3 4")
    with pytest.raises(PassRefused) as exc:
        lower_with_bin(tmp_path, ncnn, pnnx, np.float32([4]).tobytes())
    assert "an operand is not proven integer-valued ('in0' is a graph input" in exc.value.message


# masked_fill(x, eq(ge(arange(T), 0).float(), 0), -inf): the mask is all false at every T
FILL_NCNN = """7767517
0 0
Input in0 0 1 in0
Split sp 1 2 in0 x0 x1
pnnx.Expression pnnx_expr_0 1 1 x0 n
torch.arange torch.arange_0 1 1 n pos
torch.ge torch.ge_0 1 1 pos m
Tensor.to Tensor.to_0 1 1 m mf
torch.eq torch.eq_0 1 1 mf z
Tensor.masked_fill Tensor.masked_fill_0 2 1 x1 z y
ReLU relu_0 1 1 y out0
"""
FILL_PNNX = """7767517
9 8
pnnx.Input pnnx_input_0 0 1 0 #0=(1,?)f32
pnnx.Expression pnnx_expr_0 1 1 0 1 expr=size(@0,1) #0=(1,?)f32
torch.arange torch.arange_0 1 1 1 2 dtype=torch.float $end=1 #2=(?)f32
torch.ge torch.ge_0 1 1 2 3 other=0 $input=2 #2=(?)f32 #3=(?)bool
Tensor.to Tensor.to_0 1 1 3 4 copy=False dtype=torch.float $input=3 #3=(?)bool #4=(?)f32
torch.eq torch.eq_0 1 1 4 5 other=0 $input=4 #4=(?)f32 #5=(?)bool
Tensor.masked_fill Tensor.masked_fill_0 2 1 0 5 6 value=-inf $input=0 $mask=5 #0=(1,?)f32 #5=(?)bool #6=(1,?)f32
F.relu F.relu_0 1 1 6 7 $input=6 #6=(1,?)f32 #7=(1,?)f32
pnnx.Output pnnx_output_0 1 0 7 #7=(1,?)f32
"""


def test_masked_fill_with_a_mask_false_at_every_length_is_the_identity(tmp_path) -> None:
    res = lower_with_bin(tmp_path, FILL_NCNN, FILL_PNNX)
    text = dumps(res.graph)
    check_golden("lower_masks/masked_fill.param", text)
    assert "Tensor.masked_fill" not in text and "torch.eq" not in text  # unread: removed
    x = np.random.default_rng(7).standard_normal((1, 11)).astype(np.float32)
    x[0, 3] = np.inf
    got = run_saved(tmp_path, res, x)
    assert np.array_equal(got.reshape(x.shape), np.maximum(x, 0))


def test_masked_fill_with_a_mask_that_varies_is_refused(tmp_path) -> None:
    ncnn = FILL_NCNN.replace("torch.ge torch.ge_0", "torch.lt torch.lt_0")
    pnnx = FILL_PNNX.replace("torch.ge torch.ge_0 1 1 2 3 other=0",
                             "torch.lt torch.lt_0 1 1 2 3 other=4")
    with pytest.raises(PassRefused) as exc:
        lower_with_bin(tmp_path, ncnn, pnnx)
    assert "Tensor.masked_fill 'Tensor.masked_fill_0' (masked_fill): its mask is not proven " \
           "constant: ncnn has no select layer" in exc.value.message


# x + arange(T).expand(1, T), with pnnx's batch Reshape pair around the expand
EXPAND_NCNN = """7767517
0 0
Input in0 0 1 in0
Split sp 1 3 in0 x0 x1 x2
pnnx.Expression pnnx_expr_0 1 1 x0 n
torch.arange torch.arange_0 1 1 n pos
pnnx.Expression pnnx_expr_1 1 1 x1 sz
Reshape reshape_0 1 1 pos posn 12=0 13=233 6="0n"
Tensor.expand Tensor.expand_0 2 1 posn sz e
Reshape reshape_1 1 1 e ew 6="0w"
BinaryOp add_0 2 1 x2 ew out0 0=0
"""
EXPAND_PNNX = """7767517
7 6
pnnx.Input pnnx_input_0 0 1 0 #0=(1,?)f32
pnnx.Expression pnnx_expr_0 1 1 0 1 expr=size(@0,1) #0=(1,?)f32
torch.arange torch.arange_0 1 1 1 2 dtype=torch.float $end=1 #2=(?)f32
pnnx.Expression pnnx_expr_1 1 1 0 3 expr=[1,size(@0,1)] #0=(1,?)f32
Tensor.expand Tensor.expand_0 2 1 2 3 4 $input=2 $sizes=3 #2=(?)f32 #4=(1,?)f32
pnnx.Expression pnnx_expr_2 2 1 0 4 5 expr=add(@0,@1) #0=(1,?)f32 #4=(1,?)f32 #5=(1,?)f32
pnnx.Output pnnx_output_0 1 0 5 #5=(1,?)f32
"""


def test_expand_to_the_inputs_own_extent_is_the_identity(tmp_path) -> None:
    res = lower_with_bin(tmp_path, EXPAND_NCNN, EXPAND_PNNX)
    text = dumps(res.graph)
    check_golden("lower_masks/expand.param", text)
    assert "reshape_0" not in text  # the lossy batch Reshape is looked through and removed
    x = np.random.default_rng(8).standard_normal((1, 13)).astype(np.float32)
    got = run_saved(tmp_path, res, x)
    assert np.array_equal(got.reshape(x.shape), x + np.arange(13, dtype=np.float32))


def test_expand_that_broadcasts_is_refused(tmp_path) -> None:
    pnnx = EXPAND_PNNX.replace("expr=[1,size(@0,1)]", "expr=[1,add(size(@0,1),1)]")
    with pytest.raises(PassRefused) as exc:
        lower_with_bin(tmp_path, EXPAND_NCNN, pnnx)
    assert "is not proven equal to the input's extent" in exc.value.message


# x - x.mean(2, keepdim=True).repeat(1, 1, x.shape[2])  (ECAPA's statistics broadcast)
REPEAT_NCNN = """7767517
0 0
Input in0 0 1 in0
Split sp 1 3 in0 x0 x1 x2
Reduction mean_0 1 1 x0 s 0=3 1=0 -23303=1,-1 4=1 5=1
pnnx.Expression pnnx_expr_0 1 1 x1 sz
Tensor.repeat Tensor.repeat_0 2 1 s sz r
BinaryOp sub_0 2 1 x2 r out0 0=1
"""
REPEAT_PNNX = """7767517
6 5
pnnx.Input pnnx_input_0 0 1 0 #0=(1,4,?)f32
torch.mean torch.mean_0 1 1 0 1 dim=(2) keepdim=True $input=0 #0=(1,4,?)f32 #1=(1,4,1)f32
pnnx.Expression pnnx_expr_0 1 1 0 2 expr=[1,1,size(@0,2)] #0=(1,4,?)f32
Tensor.repeat Tensor.repeat_0 2 1 1 2 3 $input=1 $sizes=2 #1=(1,4,1)f32 #3=(1,4,?)f32
pnnx.Expression pnnx_expr_1 2 1 0 3 4 expr=sub(@0,@1) #0=(1,4,?)f32 #3=(1,4,?)f32 #4=(1,4,?)f32
pnnx.Output pnnx_output_0 1 0 4 #4=(1,4,?)f32
"""


def test_repeat_of_a_unit_dim_up_to_an_extent(tmp_path) -> None:
    res = lower_with_bin(tmp_path, REPEAT_NCNN, REPEAT_PNNX)
    text = dumps(res.graph)
    check_golden("lower_masks/repeat.param", text)
    x = np.random.default_rng(9).standard_normal((1, 4, 10)).astype(np.float32)
    want = x - x.mean(2, keepdims=True)
    got = run_saved(tmp_path, res, x)
    assert np.allclose(got.reshape(want.shape), want, rtol=1e-6, atol=1e-6)


# x - x.mean(2).repeat(1, 1, T) + x.amax(2).repeat(1, 1, T): two repeats, one ones table
REPEAT2_NCNN = """7767517
0 0
Input in0 0 1 in0
Split sp 1 6 in0 x0 x1 x2 x3 x4 x5
Reduction mean_0 1 1 x0 s 0=3 1=0 -23303=1,-1 4=1 5=1
pnnx.Expression pnnx_expr_0 1 1 x1 sz
Tensor.repeat Tensor.repeat_0 2 1 s sz r
Reduction max_0 1 1 x3 m 0=4 1=0 -23303=1,-1 4=1 5=1
pnnx.Expression pnnx_expr_1 1 1 x4 sz2
Tensor.repeat Tensor.repeat_1 2 1 m sz2 r2
BinaryOp sub_0 2 1 x2 r d 0=1
BinaryOp add_0 2 1 d r2 out0 0=0
"""
REPEAT2_PNNX = """7767517
10 9
pnnx.Input pnnx_input_0 0 1 0 #0=(1,4,?)f32
torch.mean torch.mean_0 1 1 0 1 dim=(2) keepdim=True $input=0 #0=(1,4,?)f32 #1=(1,4,1)f32
pnnx.Expression pnnx_expr_0 1 1 0 2 expr=[1,1,size(@0,2)] #0=(1,4,?)f32
Tensor.repeat Tensor.repeat_0 2 1 1 2 3 $input=1 $sizes=2 #1=(1,4,1)f32 #3=(1,4,?)f32
torch.amax torch.amax_0 1 1 0 4 dim=(2) keepdim=True $input=0 #0=(1,4,?)f32 #4=(1,4,1)f32
pnnx.Expression pnnx_expr_1 1 1 0 5 expr=[1,1,size(@0,2)] #0=(1,4,?)f32
Tensor.repeat Tensor.repeat_1 2 1 4 5 6 $input=4 $sizes=5 #4=(1,4,1)f32 #6=(1,4,?)f32
pnnx.Expression pnnx_expr_2 2 1 0 3 7 expr=sub(@0,@1) #0=(1,4,?)f32 #3=(1,4,?)f32 #7=(1,4,?)f32
pnnx.Expression pnnx_expr_3 2 1 7 6 8 expr=add(@0,@1) #7=(1,4,?)f32 #6=(1,4,?)f32 #8=(1,4,?)f32
pnnx.Output pnnx_output_0 1 0 8 #8=(1,4,?)f32
"""


def test_two_lowerings_share_one_table(tmp_path) -> None:
    """Each repeat's rule emits a 32768-float ones table; equal tables the pass added are
    merged into one (a Split feeds both crops), so the .bin grows by one table, not two."""
    res = lower_with_bin(tmp_path, REPEAT2_NCNN, REPEAT2_PNNX)
    check_golden("lower_masks/repeat_shared_table.param", dumps(res.graph))
    tables = [lay for lay in res.graph.by_type("MemoryData")]
    assert [lay.name for lay in tables] == ["Tensor.repeat_0_ones"]
    shared = [c for c in res.changes if c.what.startswith("shared table")]
    assert [(c.layer, c.before) for c in shared] == [("Tensor.repeat_0_ones",
                                                      "Tensor.repeat_1_ones")]
    x = np.random.default_rng(3).standard_normal((1, 4, 10)).astype(np.float32)
    want = x - x.mean(2, keepdims=True) + x.max(2, keepdims=True)
    got = run_saved(tmp_path, res, x)
    assert np.allclose(got.reshape(want.shape), want, rtol=1e-6, atol=1e-6)
    assert (tmp_path / "y.bin").stat().st_size == 32768 * 4


def test_repeat_of_a_dim_that_is_not_one_is_refused(tmp_path) -> None:
    pnnx = REPEAT_PNNX.replace("#1=(1,4,1)f32", "#1=(1,4,2)f32")
    with pytest.raises(PassRefused) as exc:
        lower_with_bin(tmp_path, REPEAT_NCNN, pnnx)
    assert "repeats dim 2 of size 2: tiling, not a broadcast" in exc.value.message


# x.transpose(1, 2) / (torch.ones(1) * x.shape[-1]) traced at T=12: pnnx folds the divisor
THAW_NCNN = """7767517
0 0
Input in0 0 1 in0
Permute transpose_0 1 1 in0 t 0=1
MemoryData pnnx_fold_n.1 0 1 n 0=1
BinaryOp div_0 2 1 t n out0 0=3
"""
THAW_PNNX = """7767517
5 4
pnnx.Input pnnx_input_0 0 1 0 #0=(1,?,4)f32
torch.transpose torch.transpose_2 1 1 0 1 dim0=1 dim1=2 $input=0 #0=(1,?,4)f32 #1=(1,4,?)f32
pnnx.Attribute pnnx_fold_n.1 0 1 2 @data=(1)f32 #2=(1)f32
pnnx.Expression pnnx_expr_0 2 1 1 2 3 expr=div(@0,@1) #1=(1,4,?)f32 #2=(1)f32 #3=(1,4,?)f32
pnnx.Output pnnx_output_0 1 0 3 #3=(1,4,?)f32
"""
THAW_SCRIPT = """import numpy as np
import ncnn
import torch

def test_inference():
    torch.manual_seed(0)
    in0 = torch.rand(1, 12, 4, dtype=torch.float)
    out = []

    with ncnn.Net() as net:
        net.load_param("m.ncnn.param")
        net.load_model("m.ncnn.bin")

        with net.create_extractor() as ex:
            ex.input("in0", ncnn.Mat(in0.numpy(), batch_index=0).clone())

            _, out0 = ex.extract("out0")
            out.append(torch.from_numpy(out0.numpy(batch_index=0)))
    return out[0]
"""


def test_a_constant_folded_at_the_traced_length_is_thawed(tmp_path) -> None:
    res = lower_with_bin(tmp_path, THAW_NCNN, THAW_PNNX, np.float32([12]).tobytes(),
                         script=THAW_SCRIPT)
    text = dumps(res.graph)
    check_golden("lower_masks/thaw.param", text)
    check_golden("lower_masks/thaw.txt", res.format(explain=True) + "\n")
    x = np.random.default_rng(10).standard_normal((1, 7, 4)).astype(np.float32)
    want = x.transpose(0, 2, 1) / 7
    got = run_saved(tmp_path, res, x)
    assert np.allclose(got.reshape(want.shape), want, rtol=2e-7, atol=0)  # ncnn: x * (1/7)


def test_a_folded_constant_is_kept_without_evidence_or_when_it_is_not_the_length(
        tmp_path) -> None:
    a, b, c = (tmp_path / d for d in "abc")
    for d in (a, b, c):
        d.mkdir()
    res = lower_with_bin(a, THAW_NCNN, THAW_PNNX, np.float32([12]).tobytes())
    assert not res.modified  # nothing records the traced length
    res = lower_with_bin(b, THAW_NCNN, THAW_PNNX, np.float32([11]).tobytes(),
                         script=THAW_SCRIPT)
    assert not res.modified
    res = lower_with_bin(c, THAW_NCNN, THAW_PNNX, np.float32([12]).tobytes(),
                         traced_len=12)  # --traced-len is evidence too
    assert res.modified and "(12, --traced-len)" in res.format()


def test_a_comparison_with_a_frozen_constant_is_refused_naming_it(tmp_path) -> None:
    ncnn = CMP_NCNN.replace("OP", "lt").replace("MemoryData k ", "MemoryData pnnx_fold_3 ")
    pnnx = CMP_PNNX.replace("OP", "lt").replace("pnnx.Attribute k ", "pnnx.Attribute pnnx_fold_3 ")
    with pytest.raises(PassRefused) as exc:
        lower_with_bin(tmp_path, ncnn, pnnx, np.float32([300]).tobytes())
    msg = exc.value.message
    assert msg.startswith("torch.lt 'torch.lt_0' (compare): compares with 'pnnx_fold_3' = 300, "
                          "a constant pnnx folded from the first trace")
    assert "keep pnnx's X_ncnn.py next to X.ncnn.param, or give --traced-len T" in msg


def test_mask_rules_are_in_the_default_set() -> None:
    for name in ("compare", "masked_fill", "expand", "repeat"):
        assert name in RULES.names()
    assert RULES.for_type("Tensor.masked_fill").name == "masked_fill"
    assert RULES.for_type("torch.eq").name == "compare"


def test_repro_of_the_folded_length_is_right_after_lower(tmp_path) -> None:
    """The repro case's bug graph as pnnx wrote it (divides by the first trace's 10 at
    every length): lower thaws the constant with pnnx's model_ncnn.py as evidence, and the
    graph matches torch at the untraced length 13."""
    from conftest import FIXTURES

    d = FIXTURES / "repros" / "size-after-transpose-folded" / "bug"
    g = paramsurgery.load(d / "model.ncnn.param", bin=d / "model.ncnn.bin")
    res = Lower(traced=d / "model.pnnx.param")(g)
    assert "thaw" in res.format() and "(10, model_ncnn.py)" in res.format()
    ref = np.load(d / "ref.npz")
    got = run_saved(tmp_path, res, ref["in0"], int(ref["batch_index_in0"]))
    want = ref["out0"]
    assert np.allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
