"""Standalone model scripts for the repro cases: the text that goes into an upstream issue.

The catalogue (`cases.py`) builds every model from shared, parameterised factories; an issue
needs each model written out on its own, the way pnnx's `tests/ncnn/test_*.py` files define
their `Model`. `SCRIPTS[case_id]` holds that text for the bug model and for its workaround.

Each class constructs the same submodules in the same order as the catalogue factory, so
`torch.manual_seed(case.seed); Model()` has exactly the catalogue's weights, and its forward
is the same torch code; tests/test_repro_cli.py checks both (state dicts equal, outputs
equal on the catalogue inputs) wherever torch is installed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CaseScript:
    model: str                 # `class Model(nn.Module)` of the bug variant
    workaround: str            # `class Model(nn.Module)` of the workaround variant
    host: str = ""             # host-side preprocessing the workaround needs (Python text)
    details: str = ""          # where in pnnx/ncnn, and what else is (not) affected
    imports: str = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


_ATTN_INIT = '''    def __init__(self):
        super().__init__()
        self.q = nn.Linear(32, 32)
        self.k = nn.Linear(32, {kv})
        self.v = nn.Linear(32, {kv})
'''

_ATTN_QKV = '''        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 8).transpose(1, 2)
        k = self.k(x).view(b, t, {h}, 8).transpose(1, 2)
        v = self.v(x).view(b, t, {h}, 8).transpose(1, 2)
'''


def _attn(kv_heads: int, body: str, args: str = "x") -> str:
    return ("class Model(nn.Module):\n" + _ATTN_INIT.format(kv=kv_heads * 8) + "\n"
            f"    def forward(self, {args}):\n" + _ATTN_QKV.format(h=kv_heads) + body)


_CODES_INIT = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(32, 8) for _ in range(3))

'''

_FUSED_QKV_INIT = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Linear(32, 32)

'''

_CONV_PAD1 = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding={pad})

'''

_STACK_INIT = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(4, 4, 3, padding=1) for _ in range(3))

    def forward(self, x):
        parts = [c(x) for c in self.convs]
'''

_CAUSAL_INIT = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 4, stride=2)   # kernel K=4, stride S=2

    def forward(self, x):
'''

_LEVELS_INIT = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(3 * 32, 8)         # 3 levels of 32 codes, one fused table
        self.conv = nn.Conv1d(8, 4, 1)
        self.register_buffer("ones", torch.ones(1, 3))

    def forward(self, ids):
        e = self.emb(ids)
'''


_POSITIONS_INIT = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.wpe = nn.Embedding(16, 8)             # a learned position table of 16 rows
        self.proj = nn.Linear(8, 8)

'''

_PATCHES = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 4, stride=4)
        self.pos = nn.Parameter(torch.randn(1, 8, 4, 4))   # a learned 4x4 position grid

    def forward(self, x):                       # x (1, 3, N, N); exported static at 12x12
        e = self.patch(x)                       # (1, 8, N/4, N/4)
        p = F.interpolate(self.pos, size=(e.shape[2], e.shape[3]), mode="bicubic",
                          align_corners=False)  # ViT's interpolate_pos_encoding
        return (e + p).flatten(2).transpose(1, 2)
'''

_HEAD = '''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32, bias=False)
        self.norm = nn.LayerNorm(8)
        {tie}

    def forward(self, x):                       # x (1, T, 8) hidden states
        return self.head(self.norm(x))
'''


# Source pointers refer to Tencent/ncnn tools/pnnx/src at a4d2ea1d4 (2026-07-22), as in the
# catalogue notes (pnnx-bugs.md).
DETAILS: dict[str, str] = {
    "repeat-kv-expand": (
        "`pass_ncnn/Tensor_expand.cpp` (expand -> Tile, PR #6399) only matches `Tensor.expand` "
        "with constant `sizes`; a size list holding the dynamic length arrives as a second "
        "input computed by a `pnnx.Expression` and stays unconverted. "
        "`pass_ncnn/F_scaled_dot_product_attention.cpp` has GQA patterns "
        "(`F_scaled_dot_product_attention_fb_gqa` / `_fb_mask_gqa`) that swallow only "
        "`torch.repeat_interleave(dim=-3)` on k and v. A static export converts the expand to "
        "`Tile` and is right at the traced length. Trap: `repeat_interleave(2, dim=1)` (same "
        "meaning) stays a raw `torch.repeat_interleave` and fails to load, static too."),
    "unbind-batch-axis": (
        "`pass_ncnn/convert_torch_unbind.cpp` skips the conversion when `dim == "
        "__batch_index` (stderr: `unbind along batch axis 0 is not supported`). `F.embedding` "
        "is in `solve_batch_index.cpp`'s batch-index-0 list, so the first axis of int codes "
        "feeding Embeddings becomes the batch axis. Float `(K,T)` input, or int `(1,K,T)` "
        "codes unbound along 1, convert right."),
    "slice-batch-axis": (
        "Since PR #6784 (`convert_torch_tensor_split.cpp`, `convert_torch_chunk.cpp`) the "
        "Slice along the batch axis is kept with placeholder params (`1=-233`, \"keep Slice op "
        "for future across-batch support\"); ncnn's Slice rejects the axis in load_param."),
    "fused-qkv-unbind": (
        "After `permute(2, 0, 3, 1, 4)` the q/k/v axis leads; pnnx infers it as the batch "
        "axis and a `Reshape ... 12=233 13=2` (PR #6784) moves it into ncnn's `n`, so the "
        "unbind is along the batch axis and has no conversion. Static exports fail the same "
        "way. `qkv.view(b, l, 3, H, D).unbind(2)` plus a transpose also converts."),
    "uneven-chunk": (
        "`convert_torch_chunk.cpp` / `convert_torch_tensor_split.cpp` write a Slice with "
        "automatic (-233) sizes. ncnn's Slice gives the remainder to the last part "
        "(9 -> 4+5, 10/3 -> 3+3+4); torch gives it to the first parts (9 -> 5+4, "
        "10/3 -> 4+4+2). pnnx warns (`tensor_split with non-perfect divided size`) only when "
        "a traced size does not divide; a static export at an odd length is wrong too."),
    "paramless-slice": (
        "ncnn's Slice (`src/layer/slice.cpp`) does not check that `slices` has one entry "
        "per top; with an empty array `forward` reads past it. The variants `1=0` alone and "
        "`-23300=0 1=0` also load and crash; `1=-233` fails in load_param. Older pnnx wrote "
        "this graph for an unbind/chunk/tensor_split along the batch axis "
        "(`convert_torch_unbind.cpp` set the type to Slice and skipped its params)."),
    "dropped-negative-slice": (
        "`pass_level5/eliminate_noop_slice.cpp` deletes a one-input `Tensor.slice` whose "
        "input and output shapes compare equal; with a dynamic last axis both are "
        "`(1,4,?)`. The slice is already gone in `model.pnnx.param`. Same for "
        "`x[:, :, :-3]`, `x[..., 3:]`, `x[..., 3:-3]` and a slice after ConvTranspose1d. Not "
        "affected: `x[..., -3:]`, negative slices of static axes, static exports. "
        "`x[..., :x.shape[-1] - 3]` also works (an expression Crop); `x.narrow(...)` does "
        "not (it stays `torch.narrow`)."),
    "stack-sum-batch-axis": (
        "The stack and the sum are both along pnnx's batch axis: `Concat 0=-233` makes ncnn "
        "return an empty Mat (dims 0, ret 0), and `pass_ncnn/torch_sum.cpp` (\"drop batch "
        "index\") removes the only reduced dim and writes `-23303=0` (no axes) with `5=1`; "
        "ncnn's Reduction on the empty Mat divides by zero. On valid data a Reduction with "
        "no axes is an identity. Parts from Linear on `(1,n,D)` get `Concat 0=0` and convert "
        "right."),
    "causal-pad-from-shape": (
        "`torch.jit.trace` records Python arithmetic on `x.shape[-1]` as constants of the "
        "traced length. The dynamic graph keeps `pnnx.Expression` "
        "(`expr=[2,sub(10,size(@0,2))]`, frozen to T=10) feeding `F.pad`, which ncnn's "
        "Padding cannot take; the static graph bakes in the pad of T=10. An integer-only "
        "rewrite `(S - (T-K+PT) % S) % S` traces correctly but still leaves "
        "`pnnx.Expression` + `F.pad`."),
    "rope-4d-no-batch": (
        "`pass_ncnn/fuse_convert_rotaryembed.cpp` (PR #6407) fuses the pattern into "
        "RotaryEmbed. With no op that pins a batch axis, every input has `batch_index=233` in "
        "`model_ncnn.py` and the q blob is 4-D (c=1, d=2, h=T, w=8); RotaryEmbed handles one "
        "head and leaves the rest uninitialised (errors 1-3, sometimes 1e30+, different on "
        "every run). With SDPA after the rope (a batch axis inferred) the fused graph is "
        "right, including full-width tables whose halves differ."),
    "int-arith-before-embed": (
        "ncnn takes int32 inputs as raw bits; `ids + 5` becomes a float `BinaryOp` applied "
        "to those bit patterns, and Embed reads the float result's bits as indices (clamped, "
        "wrong rows). `clamp(0, 31)` (`Clip`), `ids - 1` and `ids + offsets[:, None]` are "
        "wrong the same way; `view`, `reshape`, `flatten` and `transpose` of int ids are "
        "fine."),
    "sdpa-is-causal": (
        "`pass_ncnn/F_scaled_dot_product_attention.cpp` refuses `is_causal=True` (and "
        "dropout != 0), so the op stays `F.scaled_dot_product_attention` (load fail, static "
        "too). A mask built in the graph from the dynamic T (`torch.full(...).triu(1)`) "
        "leaves `torch.full` / `aten::triu`. Float additive masks (2-D to 4-D, per head) "
        "convert to one `SDPA ... 5=1` and are right."),
    "ones-padding-mask": (
        "HF's `_prepare_4d_attention_mask` on the default `torch.ones(b, T)` mask, traced with "
        "a dynamic T: `torch.ones`, `Tensor.expand` and `Tensor.to(bool)` of sizes from T "
        "stay as torch ops (pnnx converts neither), and `masked_fill` has no ncnn layer. The "
        "mask is all zero at every length; the zoo's BERT `inputshape2` export has it."),
    "dead-conv-output": (
        "pnnx is killed by SIGSEGV right after printing `############# pass_level1`, before "
        "writing any file. A dead Conv2d or LayerNorm does the same; a dead Linear, a dead "
        "`torch.relu`, or using both outputs is fine. (#3949 is an older, different "
        "pass_level1 segfault.)"),
    "axis-into-batch": (
        "Since PR #6784 (\"reshape support batch to/from dim\") Reshape params 12/13 can move "
        "a tensor axis into ncnn's batch `n`. Here pnnx propagates the batch axis pinned by "
        "the Conv1d back through the MatMul onto the level axis of `e.reshape(3, -1)`; the "
        "MatMul then runs once per level and the output comes back with the levels in `n` "
        "(`(3, 4, 1)` instead of `(1, 4, 9)`). Batch inference is context dependent: the same "
        "level sum in another graph converted right. Graphs with 12/13 also need an ncnn "
        "runtime that has PR #6784."),
    "size-after-transpose-folded": (
        "In `model.pnnx.param` the divisor is already `pnnx.Attribute pnnx_fold_n.1` "
        "(`@data=(1)f32`) while the transposed tensor's dim is `?`: constant folding treats "
        "`size()` of the transpose's output as static. Measuring the size on the input "
        "instead (`x.shape[2]` before the transpose) keeps `size(@0,2)` in a "
        "`pnnx.Expression` (no fold, but ncnn cannot load it). Met in HF ECAPA attentive "
        "statistics pooling (`_length_to_mask(lengths * seq_length)`, `mask.sum()`), frozen "
        "at the first trace's 300 frames in Qwen3-TTS's speaker encoder."),
    "one-d-through-batch-axis": (
        "pnnx's batch-axis inference gives the (T,) slice batch axis 0, and since PR #6784 it "
        "converts the slice's squeeze to `Reshape 12=0 13=233 6=\"0n\"` (elements from n "
        "into w). The Crop before it holds its T elements in w with n = 1, and ncnn's "
        "Reshape fails in forward (extract returns -1). A `torch.arange(T)` in the same place "
        "gets the same Reshape (Qwen3-TTS's speaker encoder), or, when reshaped to "
        "`(1,1,T)`, the pair `Reshape 0=1 1=1` + `12=2 13=233 6=\"0n,1,1\"` that keeps one "
        "position (Mimi's RoPE positions all become 0)."),
    "bool-mask-buffer": (
        "pnnx 20261020's ncnn writer gives a bool attribute `21=3` and writes its values as "
        "one byte each, padded to 4 bytes (`tools/pnnx/src/save_ncnn.cpp` writes the "
        "attribute's raw data); ncnn's `ModelBinFromDataReader::load` knows types 0 and 1 "
        "(`src/modelbin.cpp`: \"ModelBin load type 3 not implemented\"), so MemoryData's "
        "load_model fails. Any bool constant pnnx folds does the same (GPT-2's eager `bias`, "
        "`causal_mask` of a static export). A float constant (the additive mask) is fine."),
    "folded-position-table": (
        "A static export (one `inputshape=`) is constant-folded after tracing: "
        "`wpe(arange(T))`, `weight[:T]`, BERT's `position_ids[:, :T]` all become one "
        "`pnnx.Attribute pnnx_fold_*` of T rows, written as `MemoryData 1=T`; the table's other "
        "rows are not in the .bin. The same slice exported with `inputshape2=` keeps "
        "`MemoryData wpe 1=16` and a 2-input `Crop 20=\"1h\"` to the input's length (right at "
        "every length up to 16); `wpe(arange(T))` keeps `torch.arange` (no ncnn layer: "
        "load_fail). ncnn adds the 7 rows to 9 without an error (BinaryOp broadcasting): "
        "the output has the right shape and wrong values. The zoo's GPT-2, BERT and Whisper "
        "encoder static exports have it."),
    "folded-interpolated-table": (
        "ViT's `interpolate_pos_encoding` interpolates the learned grid (bicubic) to the "
        "patch grid of the input; a static trace folds the result (`MemoryData pnnx_fold_* "
        "0=3 1=3 2=8`). Its values at another image size are a different interpolation, so no "
        "crop, pad or second static export gives them. With `inputshape2=` pnnx writes "
        "`MemoryData pos` + `Interp 2 1 pos e 9=\"1w,1h\"` (the output size from the patch "
        "grid): right at every size (max abs err 6.4e-06 vs torch at 20x20)."),
    "tied-linear": (
        "With `lm_head.weight = embed.weight` the TorchScript graph reads the parameter once "
        "(`prim::GetAttr` of the embedding) and passes it to the head's `aten::linear`; pnnx "
        "writes `nn.Linear model.head 2 1 table x y` (weight as the first input). The ncnn "
        "writer turns it into `InnerProduct` over the table with the stored weight (a (32, "
        "32) product) and `BinaryOp bias_N` adding x: ncnn's output at T=9 is (144, 32), torch's "
        "(1, 9, 32); pnnx's own torch export calls `self.head(v_1, v_2)` and raises "
        "`TypeError: Linear.forward() takes 2 positional arguments but 3 were given`. Untying "
        "(a copy of the weight) converts to one Gemm and is right."),
}


SCRIPTS: dict[str, CaseScript] = {
    "repeat-kv-expand": CaseScript(
        model=_attn(2, '''        # HF repeat_kv: 2 kv heads repeated to 4 (unsqueeze, expand, reshape)
        k = k[:, :, None].expand(b, 2, 2, t, 8).reshape(b, 4, t, 8)
        v = v[:, :, None].expand(b, 2, 2, t, 8).reshape(b, 4, t, 8)
        return F.scaled_dot_product_attention(q, k, v, scale=8 ** -0.5)
'''),
        workaround=_attn(2, '''        k = k.repeat_interleave(2, dim=-3)   # fused into SDPA's GQA form
        v = v.repeat_interleave(2, dim=-3)
        return F.scaled_dot_product_attention(q, k, v, scale=8 ** -0.5)
'''),
    ),
    "unbind-batch-axis": CaseScript(
        model=_CODES_INIT + '''    def forward(self, codes):          # codes (3, T) int32
        a, b, c = codes.unbind(0)
        return self.emb[0](a) + self.emb[1](b) + self.emb[2](c)
''',
        workaround=_CODES_INIT + '''    def forward(self, codes):          # codes (1, 3, T) int32: a leading 1 added on the host
        a, b, c = codes.unbind(1)
        return self.emb[0](a) + self.emb[1](b) + self.emb[2](c)
''',
        host="codes = codes[None]",
    ),
    "slice-batch-axis": CaseScript(
        model=_CODES_INIT + '''    def forward(self, codes):          # codes (3, T) int32
        return sum(self.emb[i](codes[i:i + 1]) for i in range(3))
''',
        workaround=_CODES_INIT + '''    def forward(self, codes):          # codes (1, 3, T) int32: a leading 1 added on the host
        return sum(self.emb[i](codes[:, i]) for i in range(3))
''',
        host="codes = codes[None]",
    ),
    "fused-qkv-unbind": CaseScript(
        model=_FUSED_QKV_INIT + '''    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))
''',
        workaround=_FUSED_QKV_INIT + '''    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (p.view(b, t, 4, 8).transpose(1, 2) for p in self.qkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))
''',
    ),
    "uneven-chunk": CaseScript(
        model=_CONV_PAD1.format(pad=1) + '''    def forward(self, x):
        a, b = self.conv(x).chunk(2, dim=2)
        return a, b
''',
        workaround=_CONV_PAD1.format(pad=1) + '''    def forward(self, x):
        y = self.conv(x)
        half = (y.shape[-1] + 1) // 2   # torch's ceil-first split, written out
        return y[..., :half], y[..., half:]
''',
    ),
    "paramless-slice": CaseScript(
        model='''class Model(nn.Module):
    def forward(self, x):              # x (3, 4, 6)
        a, b, c = x.unbind(0)
        return a, b, c
''',
        workaround='''class Model(nn.Module):
    def forward(self, x):              # x (3, 4, 6)
        a, b, c = x.unbind(0)
        return a, b, c
''',
    ),
    "dropped-negative-slice": CaseScript(
        model=_CONV_PAD1.format(pad=2) + '''    def forward(self, x):
        y = self.conv(x)
        return y[..., :-3] * 2
''',
        workaround=_CONV_PAD1.format(pad=2) + '''    def forward(self, x):
        y = self.conv(x)
        return F.pad(y, (0, -3)) * 2     # a negative pad: pnnx keeps it as a Crop
''',
    ),
    "stack-sum-batch-axis": CaseScript(
        model=_STACK_INIT + '''        return torch.stack(parts, 0).sum(0)
''',
        workaround=_STACK_INIT + '''        return torch.stack(parts, 1).sum(1)
''',
    ),
    "causal-pad-from-shape": CaseScript(
        model=_CAUSAL_INIT + '''        # Encodec/Mimi: extra right padding so the last window is complete,
        # computed with Python numbers from the input length
        length = x.shape[-1]
        frames = (length - 4 + (4 - 2)) / 2 + 1
        extra = (math.ceil(frames) - 1) * 2 + 4 - (4 - 2) - length
        return self.conv(F.pad(x, (4 - 2, extra)))
''',
        workaround=_CAUSAL_INIT + '''        return self.conv(F.pad(x, (4 - 2, 2 - 1)))   # always pad S-1 on the right
''',
        imports="import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n",
    ),
    "rope-4d-no-batch": CaseScript(
        model='''class Model(nn.Module):
    def forward(self, q, cos, sin):    # q (1, 2, T, 8); cos, sin (1, 1, T, 8) = cat(freqs, freqs)
        h = q.shape[-1] // 2
        x1, x2 = q[..., :h], q[..., h:]
        return q * cos + torch.cat((-x2, x1), -1) * sin   # HF rotate_half
''',
        workaround='''class Model(nn.Module):
    def forward(self, q, cos, sin):    # cos, sin (1, 1, T, 4): the half-width tables
        h = q.shape[-1] // 2
        x1, x2 = q[..., :h], q[..., h:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
''',
        host="cos, sin = cos[..., :4], sin[..., :4]",
    ),
    "int-arith-before-embed": CaseScript(
        model='''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 8)

    def forward(self, ids):            # ids (T,) int32
        return self.emb(ids + 5)
''',
        workaround='''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 8)

    def forward(self, ids):            # ids (T,) int32, already offset on the host
        return self.emb(ids)
''',
        host="ids = ids + 5",
    ),
    "sdpa-is-causal": CaseScript(
        model=_attn(4, '''        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=8 ** -0.5)
'''),
        workaround=_attn(4, '''        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=8 ** -0.5)
''', args="x, mask"),
        host="mask = torch.full((T, T), float('-inf')).triu(1)   # additive causal mask",
    ),
    "ones-padding-mask": CaseScript(
        model=_attn(4, '''        m = torch.ones(b, t)[:, None, None, :].expand(b, 1, t, t)  # HF BERT, no attention_mask
        inv = 1.0 - m
        mask = inv.masked_fill(inv.to(torch.bool), torch.finfo(x.dtype).min)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=8 ** -0.5)
'''),
        workaround=_attn(4, '''        return F.scaled_dot_product_attention(q, k, v, scale=8 ** -0.5)   # no mask
'''),
    ),
    "dead-conv-output": CaseScript(
        model='''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 4, 3)
        self.c2 = nn.Conv1d(4, 4, 3)

    def forward(self, x):
        a = self.c1(x)
        b = self.c2(x)                 # computed and never used
        return a * 2
''',
        workaround='''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 4, 3)

    def forward(self, x):
        a = self.c1(x)
        return a * 2
''',
    ),
    "axis-into-batch": CaseScript(
        model=_LEVELS_INIT + '''        # ids (3*T,) level-major; sum the 3 levels per frame: ones(1, 3) @ (3, T*8)
        frames = torch.matmul(self.ones, e.reshape(3, -1)).reshape(1, -1, 8)
        return self.conv(frames.transpose(1, 2))
''',
        workaround=_LEVELS_INIT + '''        # ids (T*3,) time-major (reordered on the host); sum a real axis
        frames = e.reshape(-1, 3, 8).sum(1)[None]
        return self.conv(frames.transpose(1, 2))
''',
        host="ids = ids.reshape(3, -1).T.reshape(-1)   # level-major -> time-major",
    ),
    "size-after-transpose-folded": CaseScript(
        model='''class Model(nn.Module):
    def forward(self, x):                    # x (1, 4, T)
        y = x.transpose(1, 2)                # (1, T, 4)
        total = torch.ones(1) * y.shape[1]   # the length (ECAPA: lengths * seq_len)
        return (y / total).sum(1)
''',
        workaround='''class Model(nn.Module):
    def forward(self, x):
        y = x.transpose(1, 2)
        return y.mean(1)
''',
    ),
    "one-d-through-batch-axis": CaseScript(
        model='''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(1, 4, 1))
        self.conv = nn.Conv1d(4, 4, 1)

    def forward(self, x):                              # x (1, 4, T)
        p = (x[0, 0] * 2).reshape(1, 1, -1)           # a 1-D (T,) tensor, as arange(T)
        return self.conv(x) + self.w @ p
''',
        workaround='''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(1, 4, 1))
        self.conv = nn.Conv1d(4, 4, 1)

    def forward(self, x):
        p = x[:, 0:1] * 2                              # the same values, never 1-D
        return self.conv(x) + self.w @ p
''',
    ),
    "bool-mask-buffer": CaseScript(
        model='''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 1)
        self.register_buffer("bias", torch.tril(torch.ones(16, 16, dtype=torch.bool)).view(1, 1, 16, 16))

    def forward(self, x):                              # x (1, 4, T)
        h = self.conv(x)
        q = h.view(1, 2, 2, -1).transpose(2, 3)       # (1, heads, T, head_dim)
        s = q @ q.transpose(2, 3)
        t = x.shape[-1]
        mask_value = torch.full([], torch.finfo(s.dtype).min, dtype=s.dtype)
        s = torch.where(self.bias[:, :, :t, :t], s, mask_value)  # GPT-2's eager attention
        return s.softmax(-1)
''',
        workaround='''class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 1)
        tril = torch.tril(torch.ones(16, 16, dtype=torch.bool)).view(1, 1, 16, 16)
        self.register_buffer("neg", torch.zeros(1, 1, 16, 16).masked_fill(
            ~tril, torch.finfo(torch.float32).min))     # the mask as an additive float

    def forward(self, x):
        h = self.conv(x)
        q = h.view(1, 2, 2, -1).transpose(2, 3)       # (1, heads, T, head_dim)
        s = q @ q.transpose(2, 3)
        t = x.shape[-1]
        return (s + self.neg[:, :, :t, :t]).softmax(-1)
''',
    ),
    "folded-position-table": CaseScript(
        model=_POSITIONS_INIT + '''    def forward(self, x):                    # x (1, T, 8); exported static at T=7
        t = x.shape[1]
        return self.proj(x + self.wpe(torch.arange(t)))   # GPT-2's learned positions
''',
        workaround=_POSITIONS_INIT + '''    def forward(self, x):                    # exported with inputshape2= (T=7 and 5)
        t = x.shape[1]
        return self.proj(x + self.wpe.weight[:t])          # the same rows, cropped
''',
    ),
    "folded-interpolated-table": CaseScript(
        model=_PATCHES, workaround=_PATCHES,
        host="# the workaround is the export: the same model with inputshape2= (12x12 and 8x8)",
    ),
    "tied-linear": CaseScript(
        model=_HEAD.format(tie="self.head.weight = self.emb.weight            # tied"),
        workaround=_HEAD.format(
            tie="self.head.weight = nn.Parameter(self.emb.weight.detach().clone())  # untied"),
    ),
}


def script(case_id: str) -> CaseScript:
    try:
        sc = SCRIPTS[case_id]
    except KeyError:
        raise KeyError(f"no model script for repro case {case_id!r}") from None
    if not sc.details and case_id in DETAILS:
        from dataclasses import replace

        sc = replace(sc, details=DETAILS[case_id])
    return sc


def build(source: str, imports: str):
    """Execute a script's imports + class text and return its `Model` class (needs torch)."""
    ns: dict = {}
    exec(compile(imports + "\n\n" + source, "<paramsurgery repro script>", "exec"), ns)
    return ns["Model"]
