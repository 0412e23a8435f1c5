"""`lower` on HF's default all-ones padding mask built in a dynamic export (BERT called
without attention_mask: `torch.ones` → unsqueeze → `expand` → `1 - m` → `masked_fill(
m.to(bool), finfo.min)`): the SDPA's mask is proven 0 at every length and dropped
(passes/zero_mask.py); a buffer cropped to the input's length and expanded to it (BERT's
`token_type_ids[:, :T].expand(1, T)`) is the identity. Golden text, and ncnn at lengths the
trace (7) did not use against numpy; the zoo's BERT dynamic export end to end:
tests/test_zoo.py."""

from __future__ import annotations

import numpy as np
import pytest

from paramsurgery.formats.param_text import dumps
from paramsurgery.passes.zero_mask import uniform_value

from golden import check_golden
from test_lower_masks import THAW_SCRIPT, lower_with_bin, run_saved

ONES_NCNN = """7767517
0 0
Input in0 0 1 in0
Split sp 1 6 in0 x0 x1 x2 x3 x4 x5
MemoryData tt 0 1 tt 0=32
Crop slice_0 2 1 tt x0 ids 19="0" 20="1h" 21="0"
pnnx.Expression pnnx_expr_0 1 1 x1 sz
Tensor.expand Tensor.expand_0 2 1 ids sz idse
Reshape r_ids 1 1 idse idsc 0=1 1=-1
BinaryOp add_ids 2 1 x2 idsc h 0=0
Reshape r_q 1 1 h q 0=8 1=-1 2=1
Split spq 1 3 q q0 q1 q2
pnnx.Expression pnnx_expr_1 1 1 x3 osz
torch.ones torch.ones_0 1 1 osz ones
Split sp2 1 2 ones o0 o1
Reshape r_m 1 1 o0 o4 6="0w,1,1"
pnnx.Expression pnnx_expr_2 2 1 x4 o1 esz
Tensor.expand Tensor.expand_1 2 1 o4 esz me
BinaryOp sub_0 1 1 me inv 0=7 1=1 2=1.0
Split sp3 1 2 inv i0 i1
Tensor.to Tensor.to_0 1 1 i0 mb
Tensor.masked_fill Tensor.masked_fill_0 2 1 i1 mb mask
SDPA sdpa_0 4 1 q0 q1 q2 mask out0 5=1
"""
ONES_PNNX = """7767517
12 11
pnnx.Input pnnx_input_0 0 1 0 #0=(1,?,8)f32
pnnx.Attribute tt 0 1 1 @data=(1,32)f32 #1=(1,32)f32
pnnx.Expression pnnx_expr_9 1 1 0 2 expr=size(@0,1) #0=(1,?,8)f32
Tensor.slice slice_0 2 1 1 2 3 dim=1 start=0 step=1 $input=1 $end=2 #1=(1,32)f32 #3=(1,?)f32
pnnx.Expression pnnx_expr_0 1 1 0 4 expr=[1,size(@0,1)] #0=(1,?,8)f32
Tensor.expand Tensor.expand_0 2 1 3 4 5 $input=3 $sizes=4 #3=(1,?)f32 #5=(1,?)f32
pnnx.Expression pnnx_expr_1 1 1 0 6 expr=[1,size(@0,1)] #0=(1,?,8)f32
torch.ones torch.ones_0 1 1 6 7 dtype=None $size=6 #7=(1,?)f32
Tensor.reshape r_m 1 1 7 8 shape=(1,1,1,-1) $input=7 #7=(1,?)f32 #8=(1,1,1,?)f32
pnnx.Expression pnnx_expr_2 2 1 0 7 9 expr=[1,1,size(@0,1),size(@1,1)] #0=(1,?,8)f32 #7=(1,?)f32
Tensor.expand Tensor.expand_1 2 1 8 9 10 $input=8 $sizes=9 #8=(1,1,1,?)f32 #10=(1,1,?,?)f32
pnnx.Expression sub_0 1 1 10 11 expr=sub(1.0,@0) #10=(1,1,?,?)f32 #11=(1,1,?,?)f32
Tensor.to Tensor.to_0 1 1 11 12 copy=False dtype=torch.bool $input=11 #11=(1,1,?,?)f32 #12=(1,1,?,?)bool
Tensor.masked_fill Tensor.masked_fill_0 2 1 11 12 13 value=-3.40282347e38 $input=11 $mask=12 #11=(1,1,?,?)f32 #12=(1,1,?,?)bool #13=(1,1,?,?)f32
pnnx.Output pnnx_output_0 1 0 13
"""
TABLE = np.arange(32, dtype=np.float32) / 8


def _script() -> str:
    return THAW_SCRIPT.replace("torch.rand(1, 12, 4", "torch.rand(1, 7, 8")


def _sdpa(x: np.ndarray) -> np.ndarray:
    s = x.astype(np.float64) @ x.T.astype(np.float64) / np.sqrt(x.shape[-1])
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ x


def test_an_all_ones_padding_mask_is_dropped_and_the_crop_expand_is_the_identity(tmp_path):
    res = lower_with_bin(tmp_path, ONES_NCNN, ONES_PNNX, TABLE.tobytes(), script=_script())
    text = dumps(res.graph)
    check_golden("lower_masks/zero_mask.param", text)
    assert not [x for x in res.graph if x.type.startswith(("torch.", "Tensor.", "pnnx."))]
    said = res.format()
    assert "sdpa_0: mask proven all 0 at every length (adding 0.0 is exact): dropped" in said
    assert "Tensor.expand_0: expand" in said
    for t in (5, 11):  # the trace used 7
        x = np.random.default_rng(t).standard_normal((1, t, 8)).astype(np.float32)
        h = x[0] + TABLE[:t, None]
        got = run_saved(tmp_path, res, x).reshape(t, 8)
        want = _sdpa(h)
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-5, t


def test_a_mask_proven_nonzero_is_left(tmp_path):
    """torch.zeros: 1 - 0 = 1 is true everywhere, so masked_fill fills finfo.min: a uniform
    value, but not 0, so the SDPA keeps it (and the rules decline the fill: nothing written)."""
    import paramsurgery
    from paramsurgery import PassRefused
    from paramsurgery.formats.pnnx_param import read_pnnx_param
    from test_lower_layout import fix_header

    ncnn = ONES_NCNN.replace("torch.ones torch.ones_0", "torch.zeros torch.ones_0")
    pnnx = ONES_PNNX.replace("torch.ones torch.ones_0", "torch.zeros torch.ones_0")
    (tmp_path / "p.pnnx.param").write_text(pnnx)
    g = paramsurgery.loads(fix_header(ncnn))
    assert uniform_value(g, "mask", read_pnnx_param(tmp_path / "p.pnnx.param")) == \
        float(np.float32(-3.40282347e38))
    with pytest.raises(PassRefused) as exc:
        lower_with_bin(tmp_path, ncnn, pnnx, TABLE.tobytes(), script=_script())
    assert "Tensor.masked_fill 'Tensor.masked_fill_0'" in exc.value.message


def test_a_mask_read_from_an_input_is_not_uniform():
    import paramsurgery
    from test_lower_layout import fix_header

    g = paramsurgery.loads(fix_header("""7767517
0 0
Input in0 0 1 in0
Input in1 0 1 in1
Split sp 1 3 in0 q k v
BinaryOp sub_0 1 1 in1 m 0=7 1=1 2=1.0
SDPA sdpa_0 4 1 q k v m out0 5=1
"""))
    assert uniform_value(g, "m", None) is None
