"""lower's layout and value rules (lower_layout.py, lower_values.py, int_affine.py) and
fix-batch-reshape on small hand-written graphs: golden text, ncnn numbers at a length no
trace used against numpy, refusals with their reasons."""

from __future__ import annotations

import numpy as np
import pytest

import paramsurgery
from paramsurgery import PassRefused
from paramsurgery.passes.fix_batch_reshape import FixBatchReshape
from paramsurgery.analysis.int_affine import Affine, NotAffine, evaluate
from paramsurgery.passes.lower import RULES, Lower
from paramsurgery.runtime.child import Feed, Fetch, run

from golden import check_golden
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dumps


def lowered(tmp_path, ncnn_text: str, pnnx_text: str, **kw):  # noqa: ANN201
    traced = tmp_path / "m.pnnx.param"
    traced.write_text(pnnx_text)
    return Lower(traced=traced, **kw)(paramsurgery.loads(ncnn_text, "m.ncnn.param"))


# M-RoPE's leftovers: freqs[1, ..., 1:6:3] (pnnx's fused select + strided slice) and the
# slice assignment t[..., 1:6:3] = that, on (3, 1, T, 8) tables with batch axis 1
MROPE_NCNN = """7767517
5 7
Input in0 0 1 in0
Split sp 1 2 in0 a b
Crop select_0 1 1 a t -23310=1,1 -23311=1,0 -23309=1,0
Tensor.slice Tensor.slice_1 1 1 b s
Tensor.slice_copy Tensor.copy_2 2 1 t s out0
"""
MROPE_PNNX = """7767517
5 5
pnnx.Input pnnx_input_0 0 1 0 #0=(3,1,?,8)f32
Tensor.select Tensor.select_0 1 1 0 1 dim=0 index=0 $input=0 #0=(3,1,?,8)f32 #1=(1,?,8)f32
Tensor.slice Tensor.slice_1 1 1 0 2 dims=(0,3) ends=(0,6) selects=(1,2147483647) starts=(0,1) steps=(0,3) $input=0 #0=(3,1,?,8)f32 #2=(1,?,2)f32
Tensor.slice_copy Tensor.copy_2 2 1 1 2 3 dim=2 end=6 start=1 step=3 $self=1 $src=2 #1=(1,?,8)f32 #2=(1,?,2)f32 #3=(1,?,8)f32
pnnx.Output pnnx_output_0 1 0 3 #3=(1,?,8)f32
"""


def test_mrope_slices_golden_and_numbers(tmp_path) -> None:
    res = lowered(tmp_path, MROPE_NCNN, MROPE_PNNX)
    text = dumps(res.graph)
    check_golden("rawfix/mrope_slices.param", text)
    check_golden("rawfix/mrope_slices.txt", res.format(explain=True) + "\n")
    x = np.random.default_rng(3).standard_normal((3, 1, 9, 8)).astype(np.float32)
    want = x[0].copy()
    want[..., 1:6:3] = x[1, ..., 1:6:3]
    got = run(text, None, {"in0": Feed(x, 1)}, [Fetch("out0", 0)])["out0"]
    assert np.array_equal(got.reshape(want.shape), want)


PAD_NCNN = """7767517
3 3
Input in0 0 1 in0
F.pad F.pad_0 1 1 in0 a
F.pad F.pad_1 1 1 a out0
"""
PAD_PNNX = """7767517
4 3
pnnx.Input pnnx_input_0 0 1 0 #0=(1,4,?)f32
F.pad F.pad_0 1 1 0 1 mode=replicate pad=(2,0) $input=0 #0=(1,4,?)f32 #1=(1,4,?)f32
F.pad F.pad_1 1 1 1 2 mode=reflect pad=(1,3) $input=1 #1=(1,4,?)f32 #2=(1,4,?)f32
pnnx.Output pnnx_output_0 1 0 2 #2=(1,4,?)f32
"""


def test_replicate_and_reflect_pads_become_padding(tmp_path) -> None:
    res = lowered(tmp_path, PAD_NCNN, PAD_PNNX)
    text = dumps(res.graph)
    assert "Padding F.pad_0 1 1 in0 a 2=2 3=0 4=1 5=0.0" in " ".join(text.split())
    x = np.random.default_rng(4).standard_normal((1, 4, 11)).astype(np.float32)
    want = np.pad(np.pad(x, ((0, 0), (0, 0), (2, 0)), mode="edge"),
                  ((0, 0), (0, 0), (1, 3)), mode="reflect")
    got = run(text, None, {"in0": Feed(x, 0)}, [Fetch("out0", 0)])["out0"]
    assert np.array_equal(got.reshape(want.shape), want)


# Mimi's causal-conv extra padding: pad = [K-S, ceil(L - K + P + 1) - 1 + K - P - L] with
# K, P integer constants (pnnx.Attribute i64 -> MemoryData): 0 at every length
COMPUTED_NCNN = """7767517
7 10
Input in0 0 1 in0
Split sp 1 3 in0 x0 x1 x2
MemoryData k 0 1 kk 0=1
MemoryData p 0 1 pp 0=1
Split spk 1 2 kk k0 k1
Split spp 1 2 pp p0 p1
pnnx.Expression e0 3 1 x0 k0 p0 n
pnnx.Expression e1 4 1 n k1 p1 x1 pad
F.pad F.pad_0 2 1 x2 pad out0
"""
COMPUTED_PNNX = """7767517
7 7
pnnx.Input pnnx_input_0 0 1 0 #0=(1,1,?)f32
pnnx.Attribute k 0 1 1 @data=(1)i64 #1=(1)i64
pnnx.Attribute p 0 1 2 @data=(1)i64 #2=(1)i64
pnnx.Expression e0 3 1 0 1 2 3 expr=ceil(add(add(sub(size(@0,2),@1),@2),1)) #0=(1,1,?)f32
pnnx.Expression e1 4 1 3 1 2 0 4 expr=[6,int(sub(sub(add(sub(@0,1),@1),@2),size(@3,2)))] #0=(1,1,?)f32
F.pad F.pad_0 2 1 0 4 5 mode=constant value=0.0 $input=0 $pad=4 #0=(1,1,?)f32 #5=(1,1,?)f32
pnnx.Output pnnx_output_0 1 0 5 #5=(1,1,?)f32
"""


def fix_header(text: str) -> str:
    lines = text.splitlines()
    layers = [ln.split() for ln in lines[2:] if ln.strip()]
    blobs = {b for ln in layers for b in ln[4:4 + int(ln[2]) + int(ln[3])]}
    return "\n".join([lines[0], f"{len(layers)} {len(blobs)}"] + lines[2:]) + "\n"


def test_computed_pad_proven_constant_is_lowered(tmp_path) -> None:
    res = lowered(tmp_path, fix_header(COMPUTED_NCNN), COMPUTED_PNNX)
    text = dumps(res.graph)
    check_golden("rawfix/computed_pad.param", text)
    assert [lay.type for lay in res.graph] == ["Input", "Padding"]
    assert "removed unread" in res.format()


def test_computed_pad_that_depends_on_the_length_is_refused(tmp_path) -> None:
    pnnx = COMPUTED_PNNX.replace("expr=[6,int(sub(sub(add(sub(@0,1),@1),@2),size(@3,2)))]",
                                 "expr=[6,int(sub(@0,@1))]")
    with pytest.raises(PassRefused) as exc:
        lowered(tmp_path, fix_header(COMPUTED_NCNN), pnnx)
    assert "depends on the input length" in exc.value.message
    assert "size(in0,2)" in exc.value.message


def test_float_constant_in_shape_arithmetic_is_refused(tmp_path) -> None:
    pnnx = COMPUTED_PNNX.replace("@data=(1)i64 #1=(1)i64", "@data=(1)f32 #1=(1)f32")
    with pytest.raises(PassRefused) as exc:
        lowered(tmp_path, fix_header(COMPUTED_NCNN), pnnx)
    assert "MemoryData 'k' is not traced as an integer constant (f32)" in exc.value.message


def test_int_affine_arithmetic() -> None:
    size = Affine.of(("size", "x", 2, None))
    args = {0: size, 1: Affine(3)}
    v = evaluate("floor(sub(add(@0,@1),@0))", args.__getitem__, lambda i, d: size)
    assert v == Affine(3)
    with pytest.raises(NotAffine, match="rounds a fractional value"):
        evaluate("ceil(div(@0,2))", args.__getitem__, lambda i, d: size)
    with pytest.raises(NotAffine, match="multiplies two sizes"):
        evaluate("mul(@0,@0)", args.__getitem__, lambda i, d: size)


SLICE_REFUSALS = [
    ("dims=(0,3) ends=(0,6) selects=(1,2147483647) starts=(0,1) steps=(0,3)",
     "#0=(1,3,?,8)f32", "dim 0 has traced size 1 and may be pnnx's batch axis"),
    ("dim=2 end=2147483647 start=0 step=2", "#0=(3,1,?,8)f32",
     "a step of 2 to the end of a dynamic dim"),
    ("dim=1 end=2 start=0 step=1", "#0=(3,1,?,8)f32", "dim 1 has traced size 1"),
]


@pytest.mark.parametrize("params,shape,why", SLICE_REFUSALS)
def test_slice_refusals_name_the_reason(tmp_path, params: str, shape: str, why: str) -> None:
    ncnn = "7767517\n2 2\nInput in0 0 1 in0\nTensor.slice Tensor.slice_1 1 1 in0 out0\n"
    pnnx = (f"7767517\n3 2\npnnx.Input pnnx_input_0 0 1 0 {shape}\n"
            f"Tensor.slice Tensor.slice_1 1 1 0 1 {params} $input=0 {shape}\n"
            f"pnnx.Output pnnx_output_0 1 0 1\n")
    with pytest.raises(PassRefused) as exc:
        lowered(tmp_path, ncnn, pnnx)
    assert why in exc.value.message and exc.value.line == 4


ARANGE_NCNN = """7767517
5 6
Input in0 0 1 in0
Split sp 1 2 in0 a b
pnnx.Expression e0 1 1 a n
torch.arange torch.arange_0 1 1 n pos
BinaryOp add_0 2 1 b pos out0 0=0
"""
ARANGE_PNNX = """7767517
5 4
pnnx.Input pnnx_input_0 0 1 0 #0=(1,?)f32
pnnx.Expression e0 1 1 0 1 expr=size(@0,1) #0=(1,?)f32
torch.arange torch.arange_0 1 1 1 2 dtype=torch.float start=0 $end=1 #2=(?)f32
BinaryOp add_0 2 1 0 2 3 #3=(1,?)f32
pnnx.Output pnnx_output_0 1 0 3 #3=(1,?)f32
"""


def test_arange_over_a_shape_extent(tmp_path) -> None:
    with pytest.raises(PassRefused, match="adds a MemoryData table to the .bin"):
        lowered(tmp_path, ARANGE_NCNN, ARANGE_PNNX)
    g = paramsurgery.loads(ARANGE_NCNN, "m.ncnn.param")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    g = paramsurgery.load(_write(tmp_path / "m.ncnn.param", ARANGE_NCNN), bin=empty)
    traced = tmp_path / "m.pnnx.param"
    traced.write_text(ARANGE_PNNX)
    res = Lower(traced=traced)(g)
    check_golden("rawfix/arange.param", dumps(res.graph))
    save(res.graph, tmp_path / "y.param", tmp_path / "y.bin")
    x = np.random.default_rng(5).standard_normal((1, 37)).astype(np.float32)
    got = run((tmp_path / "y.param").read_text(), tmp_path / "y.bin", {"in0": Feed(x, 0)},
              [Fetch("out0", 0)])["out0"]
    assert np.array_equal(got.reshape(x.shape), x + np.arange(37, dtype=np.float32))


def _write(path, text: str):  # noqa: ANN001, ANN202
    path.write_text(text)
    return path


def test_int_cast_of_graph_input_is_refused_of_computed_value_is_identity(tmp_path) -> None:
    ncnn = "7767517\n2 2\nInput in0 0 1 in0\nTensor.to Tensor.to_0 1 1 in0 out0\n"
    pnnx = ("7767517\n3 2\npnnx.Input pnnx_input_0 0 1 0 #0=(1,?)i32\n"
            "Tensor.to Tensor.to_0 1 1 0 1 copy=False dtype=torch.float $input=0 #0=(1,?)i32 "
            "#1=(1,?)f32\npnnx.Output pnnx_output_0 1 0 1\n")
    with pytest.raises(PassRefused, match="comes from graph input 'in0'.*int32 bit patterns"):
        lowered(tmp_path, ncnn, pnnx)


def test_rules_are_composed_into_the_default_set() -> None:
    names = RULES.names()
    for n in ("tensor_slice", "slice_copy", "pad", "arange", "int_cast"):
        assert n in names
    assert RULES.for_type("Tensor.slice_copy").name == "slice_copy"


LOSSY = """7767517
4 4
Input in0 0 1 in0
Reshape r1 1 1 in0 a 0=1 1=1
Reshape r2 1 1 a b 12=2 13=233 6="0n,1,1"
ReLU relu 1 1 b out0
"""


def test_fix_batch_reshape_golden_numbers_and_skip() -> None:
    g = paramsurgery.loads(LOSSY, "m.param")
    res = FixBatchReshape()(g)
    check_golden("rawfix/batch_reshape.param", dumps(res.graph))
    x = np.arange(12, dtype=np.float32) - 3
    got = run(dumps(res.graph), None, {"in0": Feed(x, 233)}, [Fetch("out0", 233)])["out0"]
    assert np.array_equal(got.reshape(-1), np.maximum(x, 0))
    again = FixBatchReshape()(res.graph)
    assert not again.modified
    other = LOSSY.replace('6="0n,1,1"', '6="0n,0w,1"')
    res = FixBatchReshape()(paramsurgery.loads(other, "m.param"))
    assert not res.modified and "is not static except one 0n" in res.format(explain=True)


# dynamize --pair: a position table traced at T (rows = positions) is extended from the
# paired export's longer table when its rows are exactly the first rows there
TABLE = """7767517
4 5
Input in0 0 1 in0
MemoryData tab 0 1 t 0=2 1={T}
BinaryOp add_0 2 1 in0 t s 0=0
ReLU relu 1 1 s out0
"""


def _table_graph(tmp_path, T: int, rows: np.ndarray, tag: str):  # noqa: ANN202
    param = _write(tmp_path / f"{tag}.param", TABLE.format(T=T))
    binp = tmp_path / f"{tag}.bin"
    binp.write_bytes(rows.astype(np.float32).tobytes())
    return paramsurgery.load(param, bin=binp)


def test_dynamize_pair_extends_a_position_table(tmp_path) -> None:
    from paramsurgery.passes.dynamize import Dynamize

    rows = np.sin(np.arange(12, dtype=np.float32).reshape(6, 2))
    g = _table_graph(tmp_path, 4, rows[:4], "a")
    pair = _table_graph(tmp_path, 6, rows, "b")
    res = Dynamize(4, pair=pair, pair_len=6)(g)
    check_golden("rawfix/position_table.param", dumps(res.graph))
    assert "position table: the paired export's 6 rows (its first 4 equal these)" in res.format()
    save(res.graph, tmp_path / "y.param", tmp_path / "y.bin")
    x = np.random.default_rng(6).standard_normal((5, 2)).astype(np.float32)
    got = run((tmp_path / "y.param").read_text(), tmp_path / "y.bin", {"in0": Feed(x, 233)},
              [Fetch("out0", 233)])["out0"]
    assert np.array_equal(got.reshape(x.shape), np.maximum(x + rows[:5], 0))
    other = rows.copy()
    other[1, 0] += 1
    with pytest.raises(PassRefused, match="not the first rows of the paired table"):
        Dynamize(4, pair=_table_graph(tmp_path, 6, other, "c"), pair_len=6)(g)
    with pytest.raises(PassRefused, match="the paired export.s rows are needed to extend it: give --pair-bin"):
        Dynamize(4, pair=paramsurgery.loads(TABLE.format(T=6)), pair_len=6)(g)
