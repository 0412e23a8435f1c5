"""The seeded HF source models every fixture is cut from: `Class(config)` with our config
values (never `from_pretrained`; there is no hub access), then `weights.randomize_`.

One source model per component and size, built once per process and released when the
driver moves on (the real talker is ~0.9 B parameters, 3.6 GB in fp32).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from . import configs
from .env import import_qwen_tts
from .weights import randomize_

# One seed per source model; all variants of a module share its weights.
SEEDS: dict[str, int] = {
    "talker": 20260401,          # talker + code predictor (one HF model, as in the checkpoint)
    "codec_decoder": 20260402,
    "speaker": 20260403,
    "mimi": 20260404,
}

_cache: dict[tuple[str, str], nn.Module] = {}


def _talker(size: str) -> nn.Module:
    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSTalkerConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSTalkerForConditionalGeneration

    cfg = Qwen3TTSTalkerConfig(**configs.get(size, "talker"),
                               code_predictor_config=configs.get(size, "predictor"))
    return Qwen3TTSTalkerForConditionalGeneration(cfg)


def _codec_decoder(size: str) -> nn.Module:
    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2DecoderConfig)
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Decoder)

    return Qwen3TTSTokenizerV2Decoder(
        Qwen3TTSTokenizerV2DecoderConfig(**configs.get(size, "codec_decoder")))


def _speaker(size: str) -> nn.Module:
    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder

    return Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**configs.get(size, "speaker")))


def _mimi(size: str) -> nn.Module:
    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Encoder)
    from transformers import MimiConfig

    return Qwen3TTSTokenizerV2Encoder(MimiConfig(**configs.get(size, "mimi")))


_BUILDERS: dict[str, Callable[[str], nn.Module]] = {
    "talker": _talker,
    "codec_decoder": _codec_decoder,
    "speaker": _speaker,
    "mimi": _mimi,
}


def get(source: str, size: str) -> nn.Module:
    """The randomised source model (eval mode, no grad needed)."""
    key = (source, size)
    if key not in _cache:
        torch.manual_seed(SEEDS[source])  # class __init__ draws its own init; make it fixed too
        model = _BUILDERS[source](size).eval()
        randomize_(model, SEEDS[source])
        for p in model.parameters():
            p.requires_grad_(False)
        _cache[key] = model
    return _cache[key]


def release(source: str | None = None) -> None:
    """Drop cached source models (all when `source` is None)."""
    for key in [k for k in _cache if source is None or k[0] == source]:
        del _cache[key]


def describe(source: str, size: str) -> dict[str, Any]:
    """What the manifest records about a source model."""
    model = get(source, size)
    return {
        "class": type(model).__module__ + "." + type(model).__qualname__,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "seed": SEEDS[source],
    }
