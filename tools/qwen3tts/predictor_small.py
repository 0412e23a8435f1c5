"""predictor_embeds (ported fused table, unfused per-codebook, raw HF feedback sum) and
predictor_heads.

ported predictor_embeds (reference port): the 15 codec_embedding tables concatenated into
one (15*V, D) table, ids pre-offset by `group*V` on the host, 1-D int32 -> one Embed; the
per-frame row sum is host code. Offsets cannot be added in-graph: ncnn BinaryOp computes in
float on the int32 bit patterns that Embed reads (pnnx-bugs.md case 6b).
unfused: the 15 HF tables, one 1-D id input each, outputs summed -- the graph a
"fuse N Embed into one offset Embed" pass starts from.
raw: the HF talker's feedback construct verbatim,
`cat([codec_embedding[i](seq[..., i:i+1]) for i in range(15)], 1).sum(1, keepdim=True)`
on the predictor's (B, 15) int sequences (B = frames; HF generates one frame, B = 1).
"""

from __future__ import annotations

import torch
from torch import nn

from . import sources
from .inputs import Inputs
from .spec import VariantSpec
from .talker_small import TableLookup

EMBED_LENGTHS = (5, 15, 9)     # reference port: [5] / [15]
RAW_FRAMES = (1, 3, 2)         # raw feedback sum: frames B of the (B, 15) sequences
HEAD_LENGTHS = (1, 2, 3)       # reference port: [1,1024] / [2,1024]


class UnfusedEmbeds(nn.Module):
    def __init__(self, tables: nn.ModuleList) -> None:
        super().__init__()
        self.tables = tables

    def forward(self, *ids: torch.Tensor) -> torch.Tensor:
        acc = self.tables[0](ids[0])
        for table, group_ids in zip(list(self.tables)[1:], ids[1:]):
            acc = acc + table(group_ids)
        return acc


class FeedbackSumRaw(nn.Module):
    def __init__(self, tables: nn.ModuleList) -> None:
        super().__init__()
        self.tables = tables

    def forward(self, sequences: torch.Tensor) -> torch.Tensor:
        hiddens = torch.cat([self.tables[i](sequences[..., i:i + 1])
                             for i in range(len(self.tables))], dim=1)
        return hiddens.sum(1, keepdim=True)


class Heads(nn.Module):
    def __init__(self, heads: nn.ModuleList) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(head(hidden) for head in self.heads)


def build_embeds(size: str) -> list[VariantSpec]:
    predictor = sources.get("talker", size).code_predictor
    tables = predictor.model.codec_embedding
    groups = len(tables)
    vocab = tables[0].num_embeddings
    fused = torch.cat([t.weight.detach() for t in tables], dim=0)
    inp = Inputs()
    t1, t2, tr = EMBED_LENGTHS

    def offset_ids(n: int) -> torch.Tensor:
        # n rows, cycling through the groups, each id pre-offset by group*vocab
        groups_of = torch.arange(n) % groups
        return (inp.ids((n,), vocab).long() + groups_of * vocab).to(torch.int32)

    f1, f2, fr = offset_ids(t1), offset_ids(t2), offset_ids(tr)
    ported = VariantSpec(
        module="predictor_embeds", variant="ported", wrapper=TableLookup(fused),
        trace_inputs=(f1,), trace_inputs2=(f2,), ref_inputs=(fr,),
        input_names=["offset_ids"], output_names=["rows"], config_part="predictor",
        length_axis_note="ids (any mix of groups), id = code + group*vocab",
        trace_length=t1, trace_length2=t2, ref_length=tr,
        constructs=[f"{groups} tables concatenated to ({groups * vocab}, D), 1-D pre-offset "
                    "int32 ids -> F.embedding"],
        extra={"groups": groups, "vocab": vocab})

    def per_group(n: int) -> tuple[torch.Tensor, ...]:
        return tuple(inp.ids((n,), vocab) for _ in range(groups))

    unfused = VariantSpec(
        module="predictor_embeds", variant="unfused", wrapper=UnfusedEmbeds(tables),
        trace_inputs=per_group(t1), trace_inputs2=per_group(t2), ref_inputs=per_group(tr),
        input_names=[f"codes_group{g + 1}" for g in range(groups)], output_names=["embed_sum"],
        config_part="predictor", length_axis_note="frames (one id per group per frame)",
        trace_length=t1, trace_length2=t2, ref_length=tr,
        constructs=[f"{groups} HF Embedding tables, one 1-D int32 id input each, outputs "
                    "summed with a chain of adds"],
        extra={"groups": groups, "vocab": vocab})

    b1, b2, br = RAW_FRAMES
    raw = VariantSpec(
        module="predictor_embeds", variant="raw", wrapper=FeedbackSumRaw(tables),
        trace_inputs=(inp.ids((b1, groups), vocab),), trace_inputs2=(inp.ids((b2, groups), vocab),),
        ref_inputs=(inp.ids((br, groups), vocab),),
        input_names=["sequences"], output_names=["embed_sum"], config_part="predictor",
        length_axis_note="frames B of the (B, 15) predictor sequences",
        trace_length=b1, trace_length2=b2, ref_length=br,
        constructs=["HF feedback: seq[..., i:i+1] int slices -> 15 Embeddings -> "
                    "cat(dim=1).sum(1, keepdim=True)"],
        extra={"groups": groups, "vocab": vocab})
    return [ported, unfused, raw]


def build_heads(size: str) -> list[VariantSpec]:
    predictor = sources.get("talker", size).code_predictor
    heads = predictor.lm_head
    hidden = heads[0].in_features
    inp = Inputs()
    t1, t2, tr = HEAD_LENGTHS
    x1, x2, xr = inp.normal((t1, hidden)), inp.normal((t2, hidden)), inp.normal((tr, hidden))
    common = dict(module="predictor_heads", input_names=["hidden"],
                  output_names=[f"logits_group{g + 1}" for g in range(len(heads))],
                  config_part="predictor", length_axis_note="rows",
                  trace_length=t1, trace_length2=t2, ref_length=tr)
    ported = VariantSpec(
        variant="ported", wrapper=Heads(heads), trace_inputs=(x1,), trace_inputs2=(x2,),
        ref_inputs=(xr,), constructs=[f"tuple(head(x) for the {len(heads)} lm_heads), x (T, H)"],
        **common)
    raw = VariantSpec(
        variant="raw", wrapper=Heads(heads), trace_inputs=(x1[None],), trace_inputs2=(x2[None],),
        ref_inputs=(xr[None],),
        constructs=[f"the {len(heads)} HF lm_heads on (1, T, H) hidden states"], **common)
    return [ported, raw]

