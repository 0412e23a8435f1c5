"""The torch side of `tools/bench_e2e.py`: the qwen-tts code as released, timed on the tiny
or the real-size set (the fixtures' seeded weights, the e2e reference's inputs and greedy
settings).

What is timed: `Qwen3TTSForConditionalGeneration.generate` for `frames` frames (HF
GenerationMixin, DynamicCache), inside it every talker decoder-stack call after the prefill
(`talker.model` forward: one step) and every `code_predictor.generate` call (one predictor
group), then `Qwen3TTSTokenizerV2Decoder.forward` on all frames (torch has no streaming
codec, so there is no per-chunk figure and no first-audio latency: `generate` returns the
frames all at once). The codes must equal the stored reference, or the caller refuses.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import numpy as np


def run(threads: int, frames: int, repeat: int, reference: dict[str, np.ndarray],
        size: str = "tiny") -> dict:
    """The caller pins the arithmetic (`env.pin_arithmetic`) before torch is imported, so
    the seeded weights are the ones the reference ran with."""
    import torch

    from . import e2e_reference as er
    from . import configs, sources

    model = er.top_model(size)
    decoder = sources.get("codec_decoder", size)
    # threads only after the weights are drawn: a reduction over a tensor above torch's
    # grain size rounds differently with the thread count (env.py), and the weights would
    # no longer be the reference's
    torch.set_num_threads(threads)
    for cfg in (model.talker.config, model.talker.code_predictor.config, decoder.config):
        cfg._attn_implementation = "sdpa"
    hidden = model.config.talker_config.hidden_size
    talker_suppress, predictor_suppress = configs.suppressed_ids(size)
    model.talker.code_predictor.generation_config.suppress_tokens = predictor_suppress or None
    text_ids = torch.from_numpy(reference["input_text_ids"].astype(np.int64))[None]
    mels = torch.from_numpy(reference["input_mels"])

    steps: list[float] = []
    groups: list[float] = []
    started: dict[str, float] = {}

    def pre(_: Any, args: Any, kwargs: dict[str, Any]) -> None:
        started["talker"] = time.perf_counter()

    def post(_: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        emb = kwargs.get("inputs_embeds")
        if emb is not None and emb.shape[1] == 1:          # a cached step, not the prefill
            steps.append(time.perf_counter() - started["talker"])

    predictor = model.talker.code_predictor
    original = predictor.generate

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = original(*args, **kwargs)
        groups.append(time.perf_counter() - t)
        return out

    hooks = [model.talker.model.register_forward_pre_hook(pre, with_kwargs=True),
             model.talker.model.register_forward_hook(post, with_kwargs=True)]
    predictor.generate = timed_generate
    runs = []
    try:
        with torch.no_grad():
            for i in range(repeat + 1):                 # run 0 is the warm-up
                steps.clear()
                groups.clear()
                t0 = time.perf_counter()
                xvector = model.speaker_encoder(mels)[0]
                speaker = torch.nn.functional.pad(xvector, (0, hidden - xvector.shape[-1]))
                with er._talker_settings(model.talker, frames, talker_suppress):
                    codes_list, _ = model.generate(
                        input_ids=[text_ids], languages=[er.LANGUAGE],
                        voice_clone_prompt={"ref_spk_embedding": [speaker],
                                            "x_vector_only_mode": [True], "icl_mode": [False],
                                            "ref_code": None},
                        non_streaming_mode=False, max_new_tokens=frames + 1, do_sample=False,
                        subtalker_dosample=False, repetition_penalty=1.0)
                t_gen = time.perf_counter()
                codes = codes_list[0]
                decoder(codes.T[None].long())
                t_end = time.perf_counter()
                same = int(sum(np.array_equal(a, b) for a, b in
                               zip(codes.numpy(), reference["output_codes"][:frames])))
                if i:
                    runs.append({"total": t_end - t0, "generate": t_gen - t0,
                                 "codec_offline": (t_end - t_gen) / frames,
                                 "talker_step": float(np.median(steps)),
                                 "predictor_group": float(np.median(groups)),
                                 "codes_identical": same})
    finally:
        for h in hooks:
            h.remove()
        del predictor.generate
    med = {k: float(np.median([r[k] for r in runs])) for k in runs[0] if k != "codes_identical"}
    med["codes_identical"] = min(r["codes_identical"] for r in runs)
    med["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return med
