"""Seeded random weights that make a fixture the *real* graph (qwen3-tts.md §4.4, §6.9).

Why each step:
- Linear / Conv weights are re-drawn with std 1/sqrt(fan_in): the HF init (std 0.02) makes
  every residual branch ~0, so the stacks are ~identity and a numeric test would not notice
  a broken attention or MLP.
- SnakeBeta alpha/beta default to 0 and codebooks to embedding_sum=0 / cluster_usage=1:
  codec outputs would be degenerate, so they are re-randomised (cluster_usage positive).
- LayerScale / ConvNeXt gamma start at 0.01 / 1e-6, which silences their branches: they
  are re-drawn around 0.1.
- Residual branches of the conv stacks (codec-decoder residual units, Mimi SEANet resnet
  blocks) end with a conv scaled by RESIDUAL_GAIN, and the codec's last conv by OUTPUT_GAIN:
  with unit-gain branches the activations double every unit (std ~60 before the final
  clamp), the waveform saturates at +-1 and sin(alpha*x) of SnakeBeta turns 1e-6 rounding
  differences into O(1) output changes -- a fixture that cannot be checked numerically.
- Then every parameter and float buffer gets a small jitter: pnnx de-duplicates equal
  constants and drops all-ones affine weights (`RMSNorm 2=0`, 16 LayerScales merged into
  one MemoryData), so without it the exported graph is *not* the one real weights give.

Everything is drawn from one `torch.Generator` seeded per module, in `named_parameters()`
order, so a rebuild gives bit-identical weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

JITTER_REL = 0.05      # jitter std relative to the tensor's RMS
JITTER_ABS = 0.02      # jitter std for all-zero tensors (biases)
RESIDUAL_GAIN = 0.3    # last conv of a residual branch
OUTPUT_GAIN = 0.15     # the codec decoder's final conv (waveform well inside the +-1 clamp)


def _normal(gen: torch.Generator, shape: torch.Size, std: float) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def _fan_in(weight: torch.Tensor, module: nn.Module) -> int:
    if isinstance(module, nn.ConvTranspose1d):
        # weight (in, out/groups, k): an output sample sums in * k/stride input taps
        k = weight.shape[-1]
        stride = module.stride[0]
        return max(1, weight.shape[0] * k // max(1, stride))
    return int(weight[0].numel())


@torch.no_grad()
def randomize_(model: nn.Module, seed: int) -> None:
    """Re-draw the weights of `model` in place (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        cls = type(module).__name__
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)):
            w = module.weight
            w.copy_(_normal(gen, w.shape, 1.0 / math.sqrt(_fan_in(w, module))))
            if module.bias is not None:
                module.bias.copy_(_normal(gen, module.bias.shape, 0.05))
        elif isinstance(module, nn.Embedding):
            module.weight.copy_(_normal(gen, module.weight.shape, 1.0))
        elif cls == "SnakeBeta":
            # log-scale parameters: exp() in forward, so N(0, 0.3) gives factors ~0.5..2
            module.alpha.copy_(_normal(gen, module.alpha.shape, 0.3))
            module.beta.copy_(_normal(gen, module.beta.shape, 0.3))
        elif cls == "EuclideanCodebook":  # qwen codec codebooks (Mimi's RVQ is host code)
            usage = torch.rand(module.cluster_usage.shape, generator=gen) * 1.5 + 0.5
            module.cluster_usage.copy_(usage)
            module.embedding_sum.copy_(_normal(gen, module.embedding_sum.shape, 1.0)
                                       * usage[:, None])
        elif cls in ("Qwen3TTSTokenizerV2DecoderLayerScale", "MimiLayerScale"):
            module.scale.copy_(0.1 + _normal(gen, module.scale.shape, 0.02))
        elif cls == "Qwen3TTSTokenizerV2ConvNeXtBlock":
            module.gamma.copy_(0.1 + _normal(gen, module.gamma.shape, 0.02))
    _tame_residual_branches(model)
    for _, p in model.named_parameters():
        _jitter_(p, gen)
    for name, b in model.named_buffers():
        # float buffers that are real state (codebooks, pooling statistics) get jitter too;
        # derived tables (RoPE inv_freq) and integer buffers (Mimi conv strides) must not.
        if b.is_floating_point() and "inv_freq" not in name and b.ndim > 0 and b.numel() > 1:
            _jitter_(b, gen)


def _tame_residual_branches(model: nn.Module) -> None:
    for module in model.modules():
        cls = type(module).__name__
        if cls == "Qwen3TTSTokenizerV2DecoderDecoderResidualUnit":
            module.conv2.conv.weight.mul_(RESIDUAL_GAIN)
        elif cls == "MimiResnetBlock":
            module.block[-1].conv.weight.mul_(RESIDUAL_GAIN)
        elif cls == "Qwen3TTSTokenizerV2Decoder":
            module.decoder[-1].conv.weight.mul_(OUTPUT_GAIN)


def _jitter_(t: torch.Tensor, gen: torch.Generator) -> None:
    rms = float(t.detach().float().pow(2).mean().sqrt()) if t.numel() else 0.0
    std = JITTER_REL * rms if rms > 0 else JITTER_ABS
    t.add_(_normal(gen, t.shape, std).to(t.dtype))
