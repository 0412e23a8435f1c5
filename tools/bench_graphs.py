"""Synthetic `.param` graphs of any size for the benchmarks (`bench.py`, `bench_passes.py`).

Two shapes, both loadable by ncnn:

- `residual_chain(n)`: Split → Convolution → BinaryOp add per block, the conv/attention stacks
  pnnx writes with readable names (`conv_7`, `a7`);
- `decoder(n)`: Qwen3-style decoder blocks as pnnx writes them — numeric blob names, one
  `Split` of the mask with a top per block and one `Split` each of cos and sin with two tops
  per block (the fan-out that makes per-reader walks expensive), RMSNorm / Gemm / Reshape /
  RotaryEmbed / SDPA / SwiGLU per block.

Both return text with exactly `n` layers (the last block is cut short; a cut block leaves
dangling tops, which ncnn treats as outputs).
"""

from __future__ import annotations


def _param_text(rows: list[str]) -> str:
    blobs: set[str] = set()
    for r in rows:
        t = r.split()
        blobs.update(t[4:4 + int(t[2]) + int(t[3])])
    return f"7767517\n{len(rows)} {len(blobs)}\n" + "\n".join(rows) + "\n"


def _row(type_: str, name: str, ins: list[str], outs: list[str], params: str = "") -> str:
    head = "%-24s %-24s %d %d" % (type_, name, len(ins), len(outs))
    return " ".join([head, *ins, *outs] + ([params] if params else []))


def residual_chain(n_layers: int) -> str:
    rows = [_row("Input", "in0", [], ["in0"])]
    prev, i = "in0", 0
    while len(rows) < n_layers:
        s0, s1, c, o = f"{prev}_s0", f"{prev}_s1", f"c{i}", f"a{i}"
        rows.append(_row("Split", f"splitncnn_{i}", [prev], [s0, s1]))
        rows.append(_row("Convolution", f"conv_{i}", [s0], [c],
                         "0=16 1=3 11=3 2=1 12=1 3=1 13=1 4=1 14=1 5=1 6=2304"))
        rows.append(_row("BinaryOp", f"add_{i}", [s1, c], [o], "0=0"))
        prev, i = o, i + 1
    return _param_text(rows[:n_layers])


DECODER_BLOCK_LAYERS = 30  # layers per decoder block (see `_decoder_block`)
_HEAD_LAYERS = 10  # inputs, the Noop, the two ExpandDims and the three fan-out Splits


def _decoder_block(i: int, h: str, mask: str, cos_q: str, cos_k: str, sin_q: str, sin_k: str,
                   fresh) -> tuple[list[str], str]:
    """One attention + SwiGLU block reading residual `h`; returns its rows and the new
    residual blob."""
    b = fresh
    r: list[str] = []
    gemm = "10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8={o} 9={k}"
    res, x = b(), b()
    r.append(_row("Split", f"splitncnn_r{i}", [h], [res, x]))
    n = b()
    r.append(_row("RMSNorm", f"rmsn_{i}_0", [x], [n], "0=1024 1=1.000000e-6 2=1"))
    q_in, k_in, v_in = b(), b(), b()
    r.append(_row("Split", f"splitncnn_qkv{i}", [n], [q_in, k_in, v_in]))
    qkv = []
    for j, (src, o, heads, norm) in enumerate(((q_in, 2048, 16, True), (k_in, 1024, 8, True),
                                                (v_in, 1024, 8, False))):
        g, s = b(), b()
        r.append(_row("Gemm", f"gemm_{i}_{j}", [src], [g], gemm.format(o=o, k=1024)))
        r.append(_row("Reshape", f"reshape_{i}_{j}", [g], [s], f'6="128,{heads},0h"'))
        if norm:
            t = b()
            r.append(_row("RMSNorm", f"rmsn_{i}_{j + 1}", [s], [t], "0=128 1=1.000000e-6 2=1"))
            s = t
        p = b()
        r.append(_row("Permute", f"transpose_{i}_{j}", [s], [p], "0=2"))
        qkv.append(p)
    q, k = b(), b()
    r.append(_row("RotaryEmbed", f"rope_{i}_0", [qkv[0], cos_q, sin_q], [q], "0=0"))
    r.append(_row("RotaryEmbed", f"rope_{i}_1", [qkv[1], cos_k, sin_k], [k], "0=0"))
    a, ap, ar, o = b(), b(), b(), b()
    r.append(_row("SDPA", f"sdpa_{i}", [q, k, qkv[2], mask], [a], "5=1 6=8.83883461e-2"))
    r.append(_row("Permute", f"transpose_{i}_3", [a], [ap], "0=2"))
    r.append(_row("Reshape", f"reshape_{i}_3", [ap], [ar], '6="2048,0c"'))
    r.append(_row("Gemm", f"gemm_{i}_3", [ar], [o], gemm.format(o=1024, k=2048)))
    h1 = b()
    r.append(_row("BinaryOp", f"add_{i}_0", [res, o], [h1], "0=0"))
    res2, x2 = b(), b()
    r.append(_row("Split", f"splitncnn_m{i}", [h1], [res2, x2]))
    n2 = b()
    r.append(_row("RMSNorm", f"rmsn_{i}_3", [x2], [n2], "0=1024 1=1.000000e-6 2=1"))
    up_in, gate_in = b(), b()
    r.append(_row("Split", f"splitncnn_up{i}", [n2], [up_in, gate_in]))
    g1, act, up, prod, down, h2 = b(), b(), b(), b(), b(), b()
    r.append(_row("Gemm", f"gemm_{i}_4", [gate_in], [g1], gemm.format(o=3072, k=1024)))
    r.append(_row("Swish", f"silu_{i}", [g1], [act]))
    r.append(_row("Gemm", f"gemm_{i}_5", [up_in], [up], gemm.format(o=3072, k=1024)))
    r.append(_row("BinaryOp", f"mul_{i}", [act, up], [prod], "0=2"))
    r.append(_row("Gemm", f"gemm_{i}_6", [prod], [down], gemm.format(o=1024, k=3072)))
    r.append(_row("BinaryOp", f"add_{i}_1", [res2, down], [h2], "0=0"))
    assert len(r) == DECODER_BLOCK_LAYERS, len(r)
    return r, h2


def decoder(n_layers: int) -> str:
    blocks = max(1, -(-(n_layers - _HEAD_LAYERS) // DECODER_BLOCK_LAYERS))
    counter = iter(range(1 << 62))

    def fresh() -> str:
        return str(next(counter))

    h = fresh()
    rows = [_row("Input", "in0", [], ["in0"]), _row("Noop", "noop_in", ["in0"], [h])]
    rows.append(_row("Input", "in1", [], ["in1"]))
    masks = [fresh() for _ in range(blocks)]
    rows.append(_row("Split", "splitncnn_mask", ["in1"], masks))
    rows.append(_row("Input", "in2", [], ["in2"]))
    rows.append(_row("Input", "in3", [], ["in3"]))
    fan = {}
    for inp, what in (("in2", "cos"), ("in3", "sin")):
        e = fresh()
        rows.append(_row("ExpandDims", f"unsqueeze_{what}", [inp], [e], "-23303=1,0"))
        tops = [fresh() for _ in range(2 * blocks)]
        rows.append(_row("Split", f"splitncnn_{what}", [e], tops))
        fan[what] = tops
    assert len(rows) == _HEAD_LAYERS
    for i in range(blocks):
        block, h = _decoder_block(i, h, masks[i], fan["cos"][2 * i], fan["cos"][2 * i + 1],
                                  fan["sin"][2 * i], fan["sin"][2 * i + 1], fresh)
        rows.extend(block)
    return _param_text(rows[:n_layers])


SHAPES = {"chain": residual_chain, "decoder": decoder}
