"""Config values for the Qwen3-TTS 12Hz 0.6B Base components, written out in our own code.

`REAL` holds the released `config.json` / `speech_tokenizer/config.json` values
(qwen3-tts.md §4.1, §4.2). The package ships no config and its class defaults are *not*
the 0.6B model (e.g. talker intermediate 2048 instead of 3072, 20 layers instead of 28,
head_dim 64 if omitted, rope_theta 1e4 instead of 1e6), so every value that differs from
a default is spelled out, including the `**kwargs`-only keys (`head_dim`,
`text_vocab_size`, decoder `codebook_dim`/`head_dim`).

`TINY` has the same architecture with small numbers (qwen3-tts.md §4.3) with two deliberate
changes, both for "same architecture": the predictor keeps 16 code groups (15 embedding
tables, 15 heads; the reference suggests 4) and the codec decoder keeps 16 quantizers
(1 semantic + 15 acoustic levels; the reference suggests 4), so the tiny graphs have the
same layer structure as the real ones (15 Embed/Gemm branches, a 15-level sum). Both
cost < 0.5 MB of `.bin`.

Every config is a plain dict so it can be written verbatim into the manifest.
"""

from __future__ import annotations

import copy
from typing import Any

# qwen3-tts.md §4.1 talker_config (without code_predictor_config, which is separate below)
_TALKER_REAL: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20],
                     "rope_type": "default", "type": "default"},
    "max_position_embeddings": 32768,
    "vocab_size": 3072,
    "text_hidden_size": 2048,
    "text_vocab_size": 151936,
    "num_code_groups": 16,
    "position_id_per_seconds": 13,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "sliding_window": None,
    "use_sliding_window": False,
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
    "codec_language_id": {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070,
                          "portuguese": 2071, "spanish": 2054, "japanese": 2058, "korean": 2064,
                          "french": 2061, "russian": 2069},
    "spk_id": {},
    "spk_is_dialect": {},
}

# qwen3-tts.md §4.1 code_predictor_config
_PREDICTOR_REAL: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "max_position_embeddings": 65536,
    "vocab_size": 2048,
    "num_code_groups": 16,
    "layer_types": ["full_attention"] * 5,
    "max_window_layers": 28,
    "sliding_window": None,
    "use_sliding_window": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
}

# qwen3-tts.md §4.1 speaker_encoder_config (JSON has enc_dim + sample_rate; the rest are the
# class defaults, which match the checkpoint; written out anyway)
_SPEAKER_REAL: dict[str, Any] = {
    "mel_dim": 128,
    "enc_dim": 1024,
    "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 128,
    "enc_res2net_scale": 8,
    "enc_se_channels": 128,
    "sample_rate": 24000,
}

# qwen3-tts.md §4.2 decoder_config
_CODEC_DECODER_REAL: dict[str, Any] = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "latent_dim": 1024,
    "codebook_dim": 512,
    "codebook_size": 2048,
    "decoder_dim": 1536,
    "hidden_act": "silu",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "head_dim": 64,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 8,
    "num_quantizers": 16,
    "num_semantic_quantizers": 1,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000,
    "semantic_codebook_size": 4096,
    "sliding_window": 72,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "vector_quantization_hidden_dimension": 512,
}

# qwen3-tts.md §4.2 encoder_config (transformers MimiConfig)
_MIMI_REAL: dict[str, Any] = {
    "_frame_rate": 12.5,
    "attention_bias": False,
    "audio_channels": 1,
    "codebook_dim": 256,
    "codebook_size": 2048,
    "compress": 2,
    "dilation_growth_rate": 2,
    "head_dim": 64,
    "hidden_act": "gelu",
    "hidden_size": 512,
    "intermediate_size": 2048,
    "kernel_size": 7,
    "last_kernel_size": 3,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "norm_eps": 1e-5,
    "normalize": False,
    "num_attention_heads": 8,
    "num_filters": 64,
    "num_hidden_layers": 8,
    "num_key_value_heads": 8,
    "num_quantizers": 32,
    "num_residual_layers": 1,
    "num_semantic_quantizers": 1,
    "pad_mode": "constant",
    "residual_kernel_size": 3,
    "rope_theta": 10000,
    "sampling_rate": 24000,
    "sliding_window": 250,
    "trim_right_ratio": 1.0,
    "upsample_groups": 512,
    "upsampling_ratios": [8, 6, 5, 4],
    "use_cache": False,
    "use_causal_conv": True,
    "use_conv_shortcut": False,
    "use_streaming": False,
    "vector_quantization_hidden_dimension": 256,
}

# qwen3-tts.md §4.1 top-level config.json token ids (Qwen2 text vocabulary), plus the two
# ids of the chat layout `generate` slices (`assistant`, and "\n" = 198 in that vocabulary)
_TTS_REAL: dict[str, Any] = {
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "assistant_token_id": 77091,
    "newline_token_id": 198,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
}

REAL: dict[str, dict[str, Any]] = {
    "tts": _TTS_REAL,
    "talker": _TALKER_REAL,
    "predictor": _PREDICTOR_REAL,
    "speaker": _SPEAKER_REAL,
    "codec_decoder": _CODEC_DECODER_REAL,
    "mimi": _MIMI_REAL,
}


def _tiny() -> dict[str, dict[str, Any]]:
    tiny = copy.deepcopy(REAL)
    tiny["talker"].update({
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rope_scaling": {"interleaved": True, "mrope_section": [4, 2, 2],
                         "rope_type": "default", "type": "default"},
        "vocab_size": 96, "text_hidden_size": 32, "text_vocab_size": 128,
        "num_code_groups": 16,
        # codec ids must stay inside the tiny vocabulary (they are only config values)
        "codec_pad_id": 84, "codec_bos_id": 85, "codec_eos_token_id": 86,
        "codec_think_id": 87, "codec_nothink_id": 88, "codec_think_bos_id": 89,
        "codec_think_eos_id": 90,
        "codec_language_id": {"chinese": 70, "english": 71},
    })
    # special text ids must stay inside the tiny text vocabulary (128)
    tiny["tts"].update({
        "newline_token_id": 118, "assistant_token_id": 119, "im_start_token_id": 120,
        "im_end_token_id": 121, "tts_pad_token_id": 122, "tts_bos_token_id": 123,
        "tts_eos_token_id": 124,
    })
    tiny["predictor"].update({
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 64, "num_code_groups": 16,
        "layer_types": ["full_attention"] * 2,
    })
    tiny["speaker"].update({
        "mel_dim": 16, "enc_dim": 48, "enc_channels": [32, 32, 32, 32, 96],
        "enc_attention_channels": 16, "enc_res2net_scale": 4, "enc_se_channels": 16,
    })
    tiny["codec_decoder"].update({
        "hidden_size": 32, "head_dim": 8, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 64, "latent_dim": 48, "codebook_dim": 32, "codebook_size": 32,
        "num_hidden_layers": 2, "sliding_window": 4, "decoder_dim": 64,
        "vector_quantization_hidden_dimension": 32,
    })
    tiny["mimi"].update({
        "num_filters": 4, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
        "codebook_dim": 16, "codebook_size": 32, "vector_quantization_hidden_dimension": 16,
        "upsample_groups": 32,
    })
    return tiny


TINY: dict[str, dict[str, Any]] = _tiny()

SIZES: dict[str, dict[str, dict[str, Any]]] = {"real": REAL, "tiny": TINY}


def get(size: str, part: str) -> dict[str, Any]:
    """A deep copy of one component config (`part` in tts, talker, predictor, speaker,
    codec_decoder, mimi) for `size` in real, tiny."""
    return copy.deepcopy(SIZES[size][part])


def suppressed_ids(size: str) -> tuple[list[int], list[int]]:
    """(talker ids, code-predictor ids) greedy generation never chooses: every id that is not
    a codebook entry. HF suppresses talker ids `[vocab-1024, vocab)` except EOS, which at
    real size is exactly `[codebook_size, vocab)` minus EOS (3072 - 1024 = 2048); the tiny
    vocabularies are smaller than 1024, so the rule is stated by its meaning. The predictor
    list is empty at real size (vocab 2048 = codebook size)."""
    talker, predictor = SIZES[size]["talker"], SIZES[size]["predictor"]
    codebook = SIZES[size]["codec_decoder"]["codebook_size"]
    eos = talker["codec_eos_token_id"]
    return ([i for i in range(codebook, talker["vocab_size"]) if i != eos],
            list(range(codebook, predictor["vocab_size"])))
