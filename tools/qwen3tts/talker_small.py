"""talker_text_embed, talker_codec_embed, talker_codec_head.

ported = the reference port's wrappers (export_small_nets.py): 1-D int32 ids (T,) straight
into `F.embedding` (ncnn Embed reads 1-D int32 only; nothing may sit between the input and
the Embed), 2-D (T, H) hidden states for the head.
raw = the HF modules called the way the HF talker calls them: ids (1, T), hidden (1, T, H).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import sources
from .inputs import Inputs
from .spec import VariantSpec

TEXT_LENGTHS = (7, 13, 9)     # trace, trace2, reference (reference port: [7] / [13])
HEAD_LENGTHS = (3, 1, 5)      # reference port: [3,1024] / [1,1024]


class TextEmbedPorted(nn.Module):
    def __init__(self, table: torch.Tensor, projection: nn.Module) -> None:
        super().__init__()
        self.table = nn.Parameter(table, requires_grad=False)
        self.projection = projection

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.projection(F.embedding(ids, self.table))


class TextEmbedRaw(nn.Module):
    def __init__(self, embedding: nn.Embedding, projection: nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        self.projection = projection

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.projection(self.embedding(ids))


class TableLookup(nn.Module):
    """F.embedding on a constant table (ported codec embed / fused predictor embeds)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table, requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.table)


def _lengths_spec(lengths: tuple[int, int, int]) -> dict[str, int]:
    return {"trace_length": lengths[0], "trace_length2": lengths[1], "ref_length": lengths[2]}


def build_text_embed(size: str) -> list[VariantSpec]:
    talker = sources.get("talker", size)
    emb = talker.model.text_embedding
    proj = talker.text_projection
    vocab = emb.num_embeddings
    t1, t2, tr = TEXT_LENGTHS
    inp = Inputs()
    i1, i2, ir = inp.ids((t1,), vocab), inp.ids((t2,), vocab), inp.ids((tr,), vocab)
    common = dict(module="talker_text_embed", input_names=["text_ids"],
                  output_names=["text_embeds"], config_part="talker",
                  length_axis_note="text tokens", **_lengths_spec(TEXT_LENGTHS))
    ported = VariantSpec(
        variant="ported", wrapper=TextEmbedPorted(emb.weight.detach(), proj),
        trace_inputs=(i1,), trace_inputs2=(i2,), ref_inputs=(ir,),
        constructs=["ids (T,) int32 -> F.embedding -> text_projection (fc1, silu, fc2)"],
        **common)
    raw = VariantSpec(
        variant="raw", wrapper=TextEmbedRaw(emb, proj),
        trace_inputs=(i1[None],), trace_inputs2=(i2[None],), ref_inputs=(ir[None],),
        constructs=["HF text_embedding(ids (1,T)) -> text_projection"], **common)
    return [ported, raw]


def build_codec_embed(size: str) -> list[VariantSpec]:
    talker = sources.get("talker", size)
    emb = talker.model.codec_embedding
    vocab = emb.num_embeddings
    t1, t2, tr = TEXT_LENGTHS
    inp = Inputs()
    i1, i2, ir = inp.ids((t1,), vocab), inp.ids((t2,), vocab), inp.ids((tr,), vocab)
    common = dict(module="talker_codec_embed", input_names=["codec_ids"],
                  output_names=["codec_embeds"], config_part="talker",
                  length_axis_note="codec frames", **_lengths_spec(TEXT_LENGTHS))
    ported = VariantSpec(
        variant="ported", wrapper=TableLookup(emb.weight.detach()),
        trace_inputs=(i1,), trace_inputs2=(i2,), ref_inputs=(ir,),
        constructs=["ids (T,) int32 -> F.embedding"], **common)
    raw = VariantSpec(
        variant="raw", wrapper=emb,
        trace_inputs=(i1[None],), trace_inputs2=(i2[None],), ref_inputs=(ir[None],),
        constructs=["HF codec_embedding(ids (1,T))"], **common)
    return [ported, raw]


def build_codec_head(size: str) -> list[VariantSpec]:
    talker = sources.get("talker", size)
    head = talker.codec_head
    hidden = head.in_features
    t1, t2, tr = HEAD_LENGTHS
    inp = Inputs()
    x1, x2, xr = inp.normal((t1, hidden)), inp.normal((t2, hidden)), inp.normal((tr, hidden))
    common = dict(module="talker_codec_head", input_names=["hidden"],
                  output_names=["codec_logits"], config_part="talker",
                  length_axis_note="frames", **_lengths_spec(HEAD_LENGTHS))
    ported = VariantSpec(
        variant="ported", wrapper=head, trace_inputs=(x1,), trace_inputs2=(x2,),
        ref_inputs=(xr,), constructs=["Linear on (T, H)"], **common)
    raw = VariantSpec(
        variant="raw", wrapper=head, trace_inputs=(x1[None],), trace_inputs2=(x2[None],),
        ref_inputs=(xr[None],), constructs=["HF codec_head on (1, T, H)"], **common)
    return [ported, raw]
