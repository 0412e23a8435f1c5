"""codec_decoder: 12 Hz codes -> 24 kHz waveform (qwen3-tts.md §5 #8, §7).

ported (reference port export_codec.py, with its level sum replaced, see below):
- folded codebooks: rvq_first's table (V, d) and the 15 rvq_rest tables concatenated
  (15V, d), plain `F.embedding` lookups on int32 ids pre-offset by `level*V` on the host;
- folded SnakeBeta (exp(alpha), exp(beta) precomputed);
- causal convs with the fixed left pad (the `math.ceil` extra pad is 0 for stride 1) and
  transposed-conv right trims as `F.pad(h, (0, -r))` (a relative Crop);
- the 8 transformer layers inlined with `self_attn(x, (cos, sin), mask)` called
  positionally (through `**kwargs` the RoPE tables are frozen to the trace shape), band
  mask and cos/sin as inputs.

The acoustic level sum. The port sums the 15 levels with `ones(1,15) @ emb.reshape(15,-1)`
on level-major ids. With pnnx 20261020 that converts WRONG at real size: pnnx moves the
15-level axis into ncnn's batch `n` (`Reshape 12=233 13=0`) and the MatMul runs per batch
element (qwen3-tts.md §10). `LEVEL_SUM_FORMS` keeps the port's form next to two forms that
avoid a level axis pnnx can take for the batch: time-major ids summed over a non-batch axis
(`emb.view(T, 15, d).sum(1)`), and one Embed + one id input per level (no reshape at all).
`PORTED_LEVEL_SUM` is the one the `ported` fixture uses; the driver exports the others as
evidence (variants `ported_levelsum_<form>`) and the manifest records what each does.

raw: the body of `Qwen3TTSTokenizerV2Decoder.forward(codes)` as it is, codes (1, 16, T):
the quantizer's `enumerate(codes)` dequant (select/unbind of the level axis) with running
`+`, causal-conv extra padding computed with `math.ceil` from the traced length, in-graph
position ids and RoPE, `x[..., :shape-r]` trims, SnakeBeta with in-graph exp. One
deviation, forced: the transformer's sliding-window mask is an input (HF accepts a
prepared 4-D `attention_mask` and returns it as-is), because `torch.jit.trace` cannot
trace transformers 4.57.3's mask builder (`RuntimeError: unordered_map::at` inside the
vmapped packed-sequence mask) -- see `RAW_TRACE_NOTE`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import masks, patches, rope, sources
from .inputs import Inputs
from .patched_call import PatchedCall
from .spec import VariantSpec

LENGTHS = (25, 50, 13)       # reference port traces T=25 and T=50 frames
LEVEL_SUM_FORMS = ("time_major", "per_level", "port_matmul")
PORTED_LEVEL_SUM = "time_major"


RAW_TRACE_NOTE = ("torch.jit.trace of the unmodified Qwen3TTSTokenizerV2Decoder.forward(codes) "
                  "fails before pnnx runs: RuntimeError unordered_map::at in transformers "
                  "masking_utils (vmapped packed-sequence mask built from position_ids); the raw "
                  "fixture passes the prepared 4-D sliding-window mask instead")


class CodecDecoderRaw(nn.Module):
    """`Qwen3TTSTokenizerV2Decoder.forward` with the transformer mask as an input."""

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, codes: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        dec = self.decoder
        hidden = dec.quantizer.decode(codes)
        hidden = dec.pre_conv(hidden).transpose(1, 2)
        hidden = dec.pre_transformer(inputs_embeds=hidden, attention_mask=mask).last_hidden_state
        hidden = hidden.permute(0, 2, 1)
        for blocks in dec.upsample:
            for block in blocks:
                hidden = block(hidden)
        wav = hidden
        for block in dec.decoder:
            wav = block(wav)
        return wav.clamp(min=-1, max=1)


def _transconv_pad_trim(self: nn.Module, hidden_state: torch.Tensor) -> torch.Tensor:
    hidden_state = self.conv(hidden_state)
    if self.right_pad > 0:
        hidden_state = F.pad(hidden_state, (0, -self.right_pad))
    return hidden_state.contiguous()


def _ported_contexts(config: Any) -> list:
    from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as m

    name = patches.register_gqa_attention()
    return [
        lambda: patches.attention_impl([config], name),
        patches.codec_conv_fixed_padding,
        lambda: patches.swapped(m.Qwen3TTSTokenizerV2CausalTransConvNet, "forward",
                                _transconv_pad_trim),
    ]


class CodecDecoderPorted(nn.Module):
    def __init__(self, decoder: nn.Module, level_sum: str) -> None:
        super().__init__()
        if level_sum not in LEVEL_SUM_FORMS:
            raise ValueError(level_sum)
        folded = patches.fold_snakebeta(decoder)
        q = folded.quantizer
        rest = [layer._codebook for layer in q.rvq_rest.vq.layers]
        self.levels = len(rest)
        self.level_sum = level_sum
        self.dim = rest[0].dim
        self.register_buffer("sem_table", patches.folded_codebook(q.rvq_first.vq.layers[0]._codebook))
        if level_sum == "per_level":
            for i, cb in enumerate(rest):
                self.register_buffer(f"ac_table{i}", patches.folded_codebook(cb))
        else:
            self.register_buffer("ac_table", torch.cat([patches.folded_codebook(cb) for cb in rest]))
        if level_sum == "port_matmul":
            self.register_buffer("level_ones", torch.ones(1, self.levels))
        self.sem_proj = q.rvq_first.output_proj
        self.ac_proj = q.rvq_rest.output_proj
        self.pre_conv = folded.pre_conv
        tr = folded.pre_transformer
        self.input_proj = tr.input_proj
        self.layers = tr.layers
        self.norm = tr.norm
        self.output_proj = tr.output_proj
        self.upsample = folded.upsample
        self.decoder = folded.decoder

    def _acoustic(self, rest: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(1, d, T) sum of the 15 acoustic levels."""
        if self.level_sum == "per_level":
            acc = F.embedding(rest[0], self.ac_table0)
            for i in range(1, self.levels):
                acc = acc + F.embedding(rest[i], getattr(self, f"ac_table{i}"))
            return acc.transpose(1, 2)                                   # (1,T,d) -> (1,d,T)
        emb = F.embedding(rest[0], self.ac_table)                        # (15T, d)
        if self.level_sum == "time_major":
            summed = emb.view(-1, self.levels, self.dim).sum(1)          # (T, d)
            return summed.transpose(0, 1).unsqueeze(0)
        summed = torch.matmul(self.level_ones, emb.reshape(self.levels, -1))  # (1, T*d)
        return summed.reshape(1, -1, self.dim).transpose(1, 2)

    def forward(self, codes0: torch.Tensor, *rest_mask_cos_sin: torch.Tensor) -> torch.Tensor:
        *rest, mask, cos, sin = rest_mask_cos_sin
        sem = F.embedding(codes0, self.sem_table).transpose(1, 2)       # (1, d, T)
        hidden = self.sem_proj(sem) + self.ac_proj(self._acoustic(tuple(rest)))
        hidden = self.pre_conv(hidden).transpose(1, 2)
        hidden = self.input_proj(hidden)
        for layer in self.layers:
            residual = hidden
            attn, _ = layer.self_attn(layer.input_layernorm(hidden), (cos, sin), mask)
            hidden = residual + layer.self_attn_layer_scale(attn)
            residual = hidden
            hidden = residual + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        hidden = self.output_proj(self.norm(hidden)).permute(0, 2, 1)
        for blocks in self.upsample:
            for block in blocks:
                hidden = block(hidden)
        for block in self.decoder:
            hidden = block(hidden)
        return hidden.clamp(min=-1, max=1)


def codes_to_inputs(codes: torch.Tensor, level_sum: str, vocab: int) -> tuple[torch.Tensor, ...]:
    """(1, 16, T) codes -> the ported net's id inputs (the caller contract):
    codes0 (1, T); then time_major: (T*15,) with id[t*15 + l] = codes[l+1, t] + l*V;
    port_matmul: level-major (15*T,) with id[l*T + t] = codes[l+1, t] + l*V;
    per_level: 15 inputs (1, T), level l's own codes (no offset)."""
    c0 = codes[0, :1].to(torch.int32)
    rest = codes[0, 1:].long()                                     # (15, T)
    levels = rest.shape[0]
    if level_sum == "per_level":
        return (c0,) + tuple(rest[i:i + 1].to(torch.int32) for i in range(levels))
    offset = rest + torch.arange(levels)[:, None] * vocab
    if level_sum == "time_major":
        return c0, offset.transpose(0, 1).reshape(-1).to(torch.int32)
    return c0, offset.reshape(-1).to(torch.int32)


def _band(t: int, window: int) -> torch.Tensor:
    return masks.sliding_causal(t, window)[None, None]


def build(size: str, level_sum: str = PORTED_LEVEL_SUM, variant: str = "ported"
          ) -> VariantSpec:
    decoder = sources.get("codec_decoder", size)
    cfg = decoder.config
    vocab, nq = cfg.codebook_size, cfg.num_quantizers
    hd, theta, window = cfg.head_dim, float(cfg.rope_theta), cfg.sliding_window
    inp = Inputs()
    t1, t2, tr = LENGTHS
    codes = {t: inp.ids((1, nq, t), vocab) for t in (t1, t2, tr)}

    raw_wrapper = PatchedCall(CodecDecoderRaw(decoder),
                              [lambda: patches.attention_impl([cfg], "sdpa")])
    if variant == "raw":
        return VariantSpec(
            module="codec_decoder", variant="raw", wrapper=raw_wrapper,
            trace_inputs=(codes[t1], _band(t1, window)), trace_inputs2=(codes[t2], _band(t2, window)),
            ref_inputs=(codes[tr], _band(tr, window)),
            input_names=["codes", "mask"], output_names=["wav"], config_part="codec_decoder",
            length_axis_note="codec frames (12.5 Hz); output T*1920 samples",
            trace_length=t1, trace_length2=t2, ref_length=tr,
            extra={"trace_note": RAW_TRACE_NOTE},
            constructs=["body of HF Qwen3TTSTokenizerV2Decoder.forward(codes (1,16,T) int32), "
                        "transformer mask given as a 4-D input",
                        "RVQ decode: codes.transpose(0,1) + enumerate() per level, running +",
                        "CausalConvNet extra padding from math.ceil on the traced length",
                        "transformer: in-graph arange positions and RoPE, position_embeddings "
                        "through **kwargs",
                        "CausalTransConvNet trim x[..., :x.shape[-1]-r]",
                        "SnakeBeta exp(alpha)/exp(beta) in-graph"])

    def ported_inputs(t: int) -> tuple[torch.Tensor, ...]:
        cos, sin = rope.rope_tables(t, hd, theta)
        return codes_to_inputs(codes[t], level_sum, vocab) + (_band(t, window), cos, sin)

    wrapper = PatchedCall(CodecDecoderPorted(decoder, level_sum), _ported_contexts(cfg))
    if level_sum == "per_level":
        id_names = ["codes_level0"] + [f"codes_level{i}" for i in range(1, nq)]
    else:
        id_names = ["codes_level0", f"codes_rest_{level_sum}"]
    spec = VariantSpec(
        module="codec_decoder", variant=variant, wrapper=wrapper,
        trace_inputs=ported_inputs(t1), trace_inputs2=ported_inputs(t2),
        ref_inputs=ported_inputs(tr),
        input_names=id_names + ["mask", "cos", "sin"], output_names=["wav"],
        config_part="codec_decoder",
        length_axis_note="codec frames (12.5 Hz); output T*1920 samples",
        trace_length=t1, trace_length2=t2, ref_length=tr,
        constructs=["folded codebooks: semantic table + the 15 acoustic tables "
                    + ("as 15 separate Embeds" if level_sum == "per_level"
                       else "concatenated (15V, d), ids pre-offset by level*V"),
                    {"time_major": "level sum: time-major ids, emb.view(T, 15, d).sum(1)",
                     "per_level": "level sum: one Embed per level, chain of adds",
                     "port_matmul": "level sum (reference port): ones(1,15) @ "
                                    "emb.reshape(15, -1) on level-major ids"}[level_sum],
                    "folded SnakeBeta (exp precomputed)",
                    "causal conv: fixed left pad (k-1)*dilation, no extra pad",
                    "transposed conv trim: F.pad(h, (0, -r))",
                    "transformer layers inlined, self_attn(x, (cos, sin), mask) positional",
                    "band mask (sliding window) and cos/sin (theta 1e4) as inputs"],
        extra={"level_sum": level_sum, "vocab": vocab, "sliding_window": window,
               "rope_theta": theta, "head_dim": hd,
               "caller_contract": codes_to_inputs.__doc__})

    def hf_check() -> float:
        # against the unmodified HF forward (eager, HF builds its own mask)
        with torch.no_grad(), patches.attention_impl([cfg], "sdpa"):
            return float((wrapper(*spec.ref_inputs) - decoder(codes[tr])).abs().max())

    spec.hf_check = hf_check
    return spec


STATIC_NOTE = ("pnnx aborts re-tracing the raw decoder at inputshape2 (the math.ceil extra "
               "padding is baked from the first trace); one static trace converts, and "
               "`paramsurgery dynamize` is what makes it run at other lengths")


def build_raw_static(size: str, second: bool = False) -> VariantSpec:
    """The raw decoder exported the way pnnx can: one static trace (no inputshape2) at the
    first length, or at the second (`raw_static_pair`: what `dynamize --pair` compares it
    with), checked at the reference length like every other variant."""
    spec = build(size, variant="raw")
    spec.variant = "raw_static_pair" if second else "raw_static"
    if second:
        spec.trace_inputs, spec.trace_length = spec.trace_inputs2, spec.trace_length2
    spec.trace_inputs2 = None
    spec.trace_length2 = None
    spec.extra = {**spec.extra, "static_note": STATIC_NOTE}
    return spec


def build_all(size: str) -> list[VariantSpec]:
    """ported + raw (+ its static export) + the level-sum evidence variants."""
    specs = [build(size), build(size, variant="raw"), build_raw_static(size),
             build_raw_static(size, second=True)]
    for form in LEVEL_SUM_FORMS:
        if form != PORTED_LEVEL_SUM:
            specs.append(build(size, form, variant=f"ported_levelsum_{form}"))
    return specs
