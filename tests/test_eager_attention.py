"""`lower` on GPT-2's eager attention (MatMul → scale → torch.where(causal bias window, ·,
finfo.min) → + causal mask → Softmax → MatMul; pnnx fuses no SDPA through the where): one
SDPA reading the additive mask, the where dropped (passes/eager_attention.py). Golden text,
ncnn at the traced length, and after causal-mask at a length the trace (6) did not use,
against numpy's eager attention; refusals keep the chain. The zoo's GPT-2 eager static export
(now refused on its learned position table, not the mask): tests/test_zoo.py."""

from __future__ import annotations

import numpy as np

import paramsurgery
from paramsurgery.formats.param_text import dumps
from paramsurgery.formats.weights import set_weights
from paramsurgery.passes.causal_mask import CausalMaskPass
from paramsurgery.passes.lower import Lower
from paramsurgery.runtime.child import Feed, Fetch, run

from golden import check_golden
from test_lower_layout import fix_header

T, D = 6, 8
NEG = float(np.finfo(np.float32).min)
EAGER = f"""7767517
0 0
Input in0 0 1 q 0={D} 1={T} 11=1 2=1
Input in1 0 1 kt 0={T} 1={D} 11=1 2=1
Input in2 0 1 v 0={D} 1={T} 11=1 2=1
MatMul matmul_0 2 1 q kt s
BinaryOp div_0 1 1 s s1 0=3 1=1 2=2.82842708
MemoryData bias 0 1 cond 0={T} 1={T} 11=1 2=1
MemoryData mask_value 0 1 fill 0=1
torch.where torch.where_0 3 1 cond s1 fill s2
MemoryData causal 0 1 m 0={T} 1={T} 11=1 2=1
BinaryOp add_0 2 1 s2 m s3 0=0
Softmax softmax_0 1 1 s3 p 0=3 1=1
MatMul matmul_1 2 1 p v out0
"""


def _graph() -> paramsurgery.Graph:
    g = paramsurgery.loads(fix_header(EAGER))
    set_weights(g.layer("bias"), {"data": np.tril(np.ones((T, T), np.float32)).reshape(-1)})
    set_weights(g.layer("mask_value"), {"data": np.float32([NEG])})
    set_weights(g.layer("causal"), {"data": np.triu(np.full((T, T), NEG, np.float32), 1)
                                    .reshape(-1)})
    return g


def _eager(q, kt, v, n):  # torch's: where(bias, s, min) + triu(min) then softmax
    s = (q.astype(np.float64) @ kt) / np.sqrt(D)
    s = np.where(np.tril(np.ones((n, n), bool)), s, NEG) + np.triu(np.full((n, n), NEG), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def _run(g, tmp_path, n):
    paramsurgery.save(g, tmp_path / "g.param", tmp_path / "g.bin")
    rng = np.random.default_rng(n)
    q, v = (rng.standard_normal((1, 1, n, D)).astype(np.float32) for _ in range(2))
    kt = rng.standard_normal((1, 1, D, n)).astype(np.float32)
    out = run((tmp_path / "g.param").read_text(), tmp_path / "g.bin",
              {"q": Feed(q, 233), "kt": Feed(kt, 233), "v": Feed(v, 233)},
              [Fetch("out0", 233)])["out0"]
    want = _eager(q, kt, v, n)
    return np.abs(out.reshape(want.shape) - want).max() / np.abs(want).max()


def test_eager_attention_with_a_where_mask_becomes_one_sdpa(tmp_path):
    res = Lower()(_graph())
    check_golden("lower_masks/eager_attention.param", dumps(res.graph))
    assert "eager attention with a torch.where mask → SDPA (the where's causal window is the " \
           "added causal mask's (dropped))" in res.format()
    assert [x.type for x in res.graph if x.type in ("SDPA", "torch.where", "Softmax")] == ["SDPA"]
    assert _run(res.graph, tmp_path, T) < 1e-5
    rebuilt = CausalMaskPass()(res.graph)  # the additive constant from the lengths
    assert rebuilt.modified
    assert _run(rebuilt.graph, tmp_path, 9) < 1e-5  # a length the trace did not use


def test_a_where_window_that_is_not_causal_is_not_fused():
    g = _graph()
    bad = np.tril(np.ones((T, T), np.float32))
    bad[3, 1] = 0  # a padding hole: not the causal window
    set_weights(g.layer("bias"), {"data": bad.reshape(-1)})
    res = Lower(partial=True)(g)  # the where is then lowered as it is (min form), not fused
    assert not any(x.type == "SDPA" for x in res.graph)
    assert any(x.name == "torch.where_0" and x.type == "BinaryOp" for x in res.graph)
    assert any(s.layer == "bias" and "not 1 on and below the diagonal" in s.reason
               for s in res.skipped)
