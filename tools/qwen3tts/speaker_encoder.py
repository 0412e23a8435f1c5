"""speaker_encoder: ECAPA-TDNN, log-mel (1, T, mel) -> x-vector (1, enc_dim)
(qwen3-tts.md §5 #9; the mel front end is host code).

ported (reference port export_speaker.py): the HF model's own forward, traced inside two
patches -- attentive statistics pooling for one full-length utterance (plain mean/std,
`x*0 + stat` broadcast) and Res2Net `torch.chunk` as static channel slices.
raw: the HF forward as it is (`_length_to_mask` with `.item()`/`arange`/`lt`,
`repeat(seq_len)`, `masked_fill`, `torch.chunk`).
"""

from __future__ import annotations

import torch

from . import patches, sources
from .inputs import Inputs
from .patched_call import PatchedCall
from .spec import VariantSpec

LENGTHS = (300, 173, 211)     # reference port traces T=300 and T=173 mel frames


def build(size: str) -> list[VariantSpec]:
    model = sources.get("speaker", size)
    mel = model.blocks[0].conv.in_channels
    inp = Inputs()
    t1, t2, tr = LENGTHS
    x1, x2, xr = (inp.normal((1, t, mel)) for t in (t1, t2, tr))
    common = dict(module="speaker_encoder", trace_inputs=(x1,), trace_inputs2=(x2,),
                  ref_inputs=(xr,), input_names=["mels"], output_names=["xvector"],
                  config_part="speaker", length_axis_note="mel frames",
                  trace_length=t1, trace_length2=t2, ref_length=tr)
    ported = VariantSpec(
        variant="ported", wrapper=PatchedCall(model, [patches.speaker_pooling_patch]),
        constructs=["HF forward", "attentive statistics pooling without the length mask "
                    "(full-length utterance), stats broadcast as x*0 + stat",
                    "Res2Net chunk -> static channel slices"], **common)
    raw = VariantSpec(
        variant="raw", wrapper=model,
        constructs=["HF forward as is: _length_to_mask (.item(), arange, lt), "
                    "repeat(1,1,seq_len), masked_fill, torch.chunk"], **common)

    def hf_check() -> float:
        with torch.no_grad():
            return float((ported.wrapper(xr) - model(xr)).abs().max())

    ported.hf_check = hf_check
    return [ported, raw]
