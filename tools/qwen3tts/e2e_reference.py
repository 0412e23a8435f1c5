"""The end-to-end torch reference: greedy Qwen3-TTS generation by the qwen-tts modeling code
with the fixtures' seeded weights, then the codec decoder's waveform (`e2e.ref.npz`).

What runs is HF code as it is: `Qwen3TTSForConditionalGeneration.generate` (prompt
construction, x-vector speaker prompt, non-streaming=False trailing text) drives
`talker.generate` (transformers GenerationMixin, DynamicCache, the talker's M-RoPE, HF
`sdpa` attention with `repeat_kv`), which calls `code_predictor.generate` for the 15
residual groups of every frame; the waveform is `Qwen3TTSTokenizerV2Decoder.forward(codes)`.
The talker, speaker encoder and codec decoder are the very seeded source models the tiny
fixtures are exported from (`sources.get`), so ncnn runs the same weights.

Settings, and why:
- greedy: `do_sample=False`, `subtalker_dosample=False`, `repetition_penalty=1.0` (the
  released generation config samples; a parity test needs a deterministic choice);
- exactly FRAMES frames: `max_new_tokens = min_new_tokens = FRAMES + 1` (the last token's
  predictor never runs in HF, so N+1 tokens give N frames) -- EOS is never chosen;
- suppressed tokens: HF suppresses talker ids `[vocab-1024, vocab)` except EOS, i.e. every
  id that is not a codebook entry at real size (3072 - 1024 = 2048 = codebook size). The tiny
  talker vocabulary (96) is smaller than 1024, so the rule is restated with its meaning:
  `[codebook_size, talker vocab)` minus EOS (identical to HF's list at real size). The tiny
  predictor vocabulary (64) is also larger than the tiny codebook (32): its ids
  `[codebook_size, predictor vocab)` are suppressed through its generation config (an empty
  list at real size), so every code can be decoded;
- speaker: the x-vector of the speaker encoder on seeded log-mel features (the mel front
  end is host code, not a net). The tiny speaker encoder's enc_dim (48) is smaller than the
  tiny talker's hidden size (64): the x-vector is zero-padded to 64 (real size: 1024 = 1024);
- text: seeded token ids in the chat layout `generate` slices (3 role ids, the text, 5
  closing ids); the special ids below are inside the tiny text vocabulary.

Keys of the npz (all consumed by `tools/e2e_qwen3tts.py`, which needs no torch):
`input_text_ids` (L,) int32, `input_mels` (1, Tm, mel) float32, `meta_*` int32 scalars and
id lists (the generation settings above, so the ncnn side follows exactly what torch did),
`output_xvector` (enc_dim,), `output_prompt_embeds` (P, hidden) and
`output_trailing_text` (K, hidden) (what `generate` fed the talker), `output_codes`
(FRAMES, 16) int32, `output_wav` (FRAMES * 1920,) float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from . import configs, sources
from .env import import_qwen_tts
from .inputs import Inputs

FRAMES = 24
TEXT_TOKENS = 8            # tokens between the 3 role ids and the 5 closing ids
MEL_FRAMES = 96
E2E_INPUT_SEED = 19
LANGUAGE = "english"


def _top_config(size: str) -> Any:
    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig

    tts = configs.get(size, "tts")
    talker = dict(configs.get(size, "talker"), code_predictor_config=configs.get(size, "predictor"))
    return Qwen3TTSConfig(talker_config=talker, speaker_encoder_config=configs.get(size, "speaker"),
                          tts_model_type="base", tts_model_size="0b6",
                          tokenizer_type="qwen3_tts_tokenizer_12hz", **tts)


@contextlib.contextmanager
def _talker_settings(talker: Any, frames: int, suppress: list[int]) -> Iterator[None]:
    """`Qwen3TTSForConditionalGeneration.generate` builds the talker's kwargs itself; restate
    the two that cannot be passed (suppress list, min_new_tokens) on their way in."""
    original = talker.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        kwargs["suppress_tokens"] = suppress
        kwargs["min_new_tokens"] = frames + 1
        return original(*args, **kwargs)

    talker.generate = generate
    try:
        yield
    finally:
        del talker.generate


def top_model(size: str) -> Any:
    """`Qwen3TTSForConditionalGeneration` with the seeded source talker and speaker encoder.
    At real size the top model is built on the meta device first: its own randomly
    initialised talker (3.6 GB) is replaced at once, and would double the peak memory."""
    import_qwen_tts()
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration

    torch.manual_seed(E2E_INPUT_SEED)
    if size == "real":
        with torch.device("meta"):
            model = Qwen3TTSForConditionalGeneration(_top_config(size)).eval()
    else:       # tiny: as e2e.ref.npz was made (byte-identical rebuilds)
        model = Qwen3TTSForConditionalGeneration(_top_config(size)).eval()
    model.talker = sources.get("talker", size)
    model.speaker_encoder = sources.get("speaker", size)
    return model


@contextlib.contextmanager
def _logit_recorder(model: Any) -> Iterator[dict[str, list[Any]]]:
    """The last position's logits of every codec-head call (code 0 of each frame; the
    prefill gives frame 0's) and of every code-predictor head call (head g-1 gives code g),
    in call order: what greedy chose from, before the suppress list."""
    rec: dict[str, list[Any]] = {"talker": [], "predictor": []}   # rows; (group, row)
    heads = model.talker.code_predictor.lm_head

    def talker(_: Any, __: Any, out: torch.Tensor) -> None:
        rec["talker"].append(out[0, -1].detach().clone())

    def predictor(g: int) -> Any:
        def hook(_: Any, __: Any, out: torch.Tensor) -> None:
            rec["predictor"].append((g, out[0, -1].detach().clone()))
        return hook

    handles = [model.talker.codec_head.register_forward_hook(talker)]
    handles += [h.register_forward_hook(predictor(g)) for g, h in enumerate(heads)]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


def _logit_arrays(rec: dict[str, list[Any]], frames: int, groups: int
                  ) -> dict[str, np.ndarray]:
    talker = torch.stack(rec["talker"][:frames]).numpy().astype(np.float32)
    per_group: list[list[torch.Tensor]] = [[] for _ in range(groups - 1)]
    for g, row in rec["predictor"]:
        per_group[g].append(row)
    pred = torch.stack([torch.stack(rows[:frames]) for rows in per_group], 1)
    return {"output_logits_talker": talker,                        # (frames, vocab)
            "output_logits_predictor": pred.numpy().astype(np.float32)}   # (frames, 15, V)


def build(size: str = "tiny", frames: int = FRAMES, logits: bool = False
          ) -> dict[str, np.ndarray]:
    """The reference arrays (module docstring). `logits`: also every greedy choice's logits
    (`output_logits_talker` (frames, vocab), `output_logits_predictor` (frames, 15, V)),
    so a divergence can be judged: a near tie or a defect."""
    model = top_model(size)
    decoder = sources.get("codec_decoder", size)
    for cfg in (model.talker.config, model.talker.code_predictor.config, decoder.config):
        cfg._attn_implementation = "sdpa"   # the HF default; pinned against a leaked patch
    tcfg = model.config.talker_config
    hidden = tcfg.hidden_size
    talker_suppress, predictor_suppress = configs.suppressed_ids(size)
    model.talker.code_predictor.generation_config.suppress_tokens = predictor_suppress or None

    tts = configs.get(size, "tts")
    inp = Inputs(E2E_INPUT_SEED)
    text_vocab = tcfg.text_vocab_size
    words = inp.ids((TEXT_TOKENS,), min(tts.values()))          # below every special id
    role = [tts["im_start_token_id"], tts["assistant_token_id"], tts["newline_token_id"]]
    closing = [tts["im_end_token_id"], tts["newline_token_id"], tts["im_start_token_id"],
               tts["assistant_token_id"], tts["newline_token_id"]]
    text_ids = torch.tensor(role + words.tolist() + closing, dtype=torch.int64)[None]
    assert int(text_ids.max()) < text_vocab
    mel_dim = model.speaker_encoder.blocks[0].conv.in_channels
    mels = inp.normal((1, MEL_FRAMES, mel_dim))

    with torch.no_grad():
        xvector = model.speaker_encoder(mels)[0]
        speaker = F.pad(xvector, (0, hidden - xvector.shape[-1]))
        fed: dict[str, torch.Tensor] = {}

        def record_prompt(_: Any, args: Any, kwargs: dict[str, Any]) -> None:
            # a pre-hook keeps forward's signature (generate validates kwargs against it)
            emb = kwargs.get("inputs_embeds")
            if emb is not None and emb.shape[1] > 1 and "prompt" not in fed:
                fed["prompt"] = emb[0].clone()
                fed["trailing"] = kwargs["trailing_text_hidden"][0].clone()

        hook = model.talker.register_forward_pre_hook(record_prompt, with_kwargs=True)
        try:
            with _talker_settings(model.talker, frames, talker_suppress), \
                    _logit_recorder(model) as recorded:
                codes_list, _ = model.generate(
                    input_ids=[text_ids], languages=[LANGUAGE],
                    voice_clone_prompt={"ref_spk_embedding": [speaker], "x_vector_only_mode": [True],
                                        "icl_mode": [False], "ref_code": None},
                    non_streaming_mode=False, max_new_tokens=frames + 1, do_sample=False,
                    subtalker_dosample=False, repetition_penalty=1.0)
        finally:
            hook.remove()
        codes = codes_list[0]                                     # (frames, 16)
        if codes.shape[0] != frames:
            raise AssertionError(f"generate gave {codes.shape[0]} frames, expected {frames}")
        wav = decoder(codes.T[None].long())                       # (1, 1, frames * 1920)

    meta = {
        "meta_frames": [frames],
        "meta_hidden": [hidden],
        "meta_tts_bos_eos_pad": [tts["tts_bos_token_id"], tts["tts_eos_token_id"],
                                 tts["tts_pad_token_id"]],
        "meta_codec_think": [tcfg.codec_think_id, tcfg.codec_think_bos_id,
                             tcfg.codec_language_id[LANGUAGE], tcfg.codec_think_eos_id],
        "meta_codec_pad_bos": [tcfg.codec_pad_id, tcfg.codec_bos_id],
        "meta_codec_eos": [tcfg.codec_eos_token_id],
        "meta_talker_suppress": talker_suppress,
        "meta_predictor_suppress": predictor_suppress or [-1],
        "meta_groups": [tcfg.num_code_groups],
        "meta_codebook_size": [decoder.config.codebook_size],
    }
    arrays: dict[str, np.ndarray] = {k: np.asarray(v, np.int32) for k, v in meta.items()}
    arrays.update({
        "input_text_ids": text_ids[0].numpy().astype(np.int32),
        "input_mels": mels.numpy().astype(np.float32),
        "output_xvector": xvector.numpy().astype(np.float32),
        "output_prompt_embeds": fed["prompt"].numpy().astype(np.float32),
        "output_trailing_text": fed["trailing"].numpy().astype(np.float32),
        "output_codes": codes.numpy().astype(np.int32),
        "output_wav": wav.reshape(-1).numpy().astype(np.float32),
    })
    if logits:
        arrays.update(_logit_arrays(recorded, frames, tcfg.num_code_groups))
    return arrays


def describe(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The manifest record of the reference (what it is, how it was made)."""
    return {
        "frames": int(arrays["meta_frames"][0]),
        "prompt_length": int(arrays["output_prompt_embeds"].shape[0]),
        "text_tokens": int(arrays["input_text_ids"].shape[0]),
        "mel_frames": int(arrays["input_mels"].shape[1]),
        "language": LANGUAGE,
        "input_seed": E2E_INPUT_SEED,
        "generation": "Qwen3TTSForConditionalGeneration.generate, greedy (do_sample=False, "
                      "subtalker_dosample=False, repetition_penalty=1.0), x-vector speaker "
                      "prompt, non_streaming_mode=False, min/max_new_tokens = frames + 1",
        "waveform": "Qwen3TTSTokenizerV2Decoder.forward(codes (1, 16, frames))",
        "suppressed": {"talker": "[codebook_size, vocab) minus EOS (HF: [vocab-1024, vocab) "
                                 "minus EOS; the same list at real size)",
                       "predictor": "[codebook_size, predictor vocab) (empty at real size)"},
        "speaker": "x-vector zero-padded from enc_dim to the talker hidden size (tiny only)",
    }
