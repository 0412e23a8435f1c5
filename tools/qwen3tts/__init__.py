"""Generators for the Qwen3-TTS 12Hz 0.6B fixture set (fixtures/qwen3_tts).

One concept per module:
- `env`: importing qwen_tts without torchaudio, and the tool versions recorded in the manifest;
- `configs`: the real 0.6B config values and the tiny configs of the same architecture;
- `weights`: seeded random weights (re-init, re-randomised buffers, jitter);
- `rope`, `masks`: the position tables and additive masks fed to the exported nets;
- `patches`: the reference port's export patches (as context managers / folded copies);
- `spec`: what a module builder returns (wrapper, trace inputs, reference inputs, I/O names);
- `talker_small`, `decoder_stack`, `predictor_small`, `codec_decoder`, `speaker_encoder`,
  `mimi_encoder`: the per-module builders (ported / raw / unfused variants);
- `kvcache_reference`: prefill + single-step references for the decoder stacks;
- `npz`: byte-reproducible .npz files;
- `ncnn_check`: running a fixture in ncnn and classifying the outcome;
- `pipeline`: export one module variant, check it, and describe it for the manifest;
- `e2e_reference`: the end-to-end torch reference (greedy HF generation + waveform);
- `assemble`, `ncnn_pipeline`: the ncnn pipeline built with paramsurgery's passes and its
  generation loop (`tools/e2e_qwen3tts.py`; no torch).

torch / transformers / qwen_tts are imported by the builders only; `configs`, `npz`,
`ncnn_check`, `assemble` and `ncnn_pipeline` work without torch.
"""
