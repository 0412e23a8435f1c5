"""The ten Qwen3-TTS nets: name -> (source model, builder). Order = export order (modules
of one source are adjacent so the source model is built once and released after)."""

from __future__ import annotations

from typing import Callable

from . import codec_decoder, decoder_stack, mimi_encoder, predictor_small, speaker_encoder, \
    talker_small
from .spec import VariantSpec

Builder = Callable[[str], list[VariantSpec]]

MODULES: dict[str, tuple[str, Builder]] = {
    "talker_text_embed": ("talker", talker_small.build_text_embed),
    "talker_codec_embed": ("talker", talker_small.build_codec_embed),
    "talker_decoder": ("talker", lambda size: decoder_stack.build("talker_decoder", size)),
    "talker_codec_head": ("talker", talker_small.build_codec_head),
    "predictor_decoder": ("talker", lambda size: decoder_stack.build("predictor_decoder", size)),
    "predictor_embeds": ("talker", predictor_small.build_embeds),
    "predictor_heads": ("talker", predictor_small.build_heads),
    "codec_decoder": ("codec_decoder", codec_decoder.build_all),
    "speaker_encoder": ("speaker", speaker_encoder.build),
    "mimi_encoder": ("mimi", mimi_encoder.build),
}

# modules that also get a prefill + single-step kv-cache reference (tiny)
KV_MODULES = ("talker_decoder", "predictor_decoder")

# which config dicts describe each source (manifest cross-reference)
SOURCE_CONFIG_PARTS: dict[str, list[str]] = {
    "talker": ["talker", "predictor"],
    "codec_decoder": ["codec_decoder"],
    "speaker": ["speaker"],
    "mimi": ["mimi"],
}
