"""What a per-module builder hands to the export pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn


@dataclass
class VariantSpec:
    """One exportable variant of one module.

    The wrapper's positional `forward` arguments become pnnx inputs in0..inN in order and its
    returned tensors out0..outM; `input_names` / `output_names` are our descriptive names
    for them (npz keys). `trace_inputs` and `trace_inputs2` are the two pnnx trace shapes
    (dynamic length); `ref_inputs` use a length neither trace used.
    """

    module: str                      # e.g. "talker_decoder"
    variant: str                     # "ported" | "raw" | "unfused"
    wrapper: nn.Module
    trace_inputs: tuple[torch.Tensor, ...]
    trace_inputs2: tuple[torch.Tensor, ...] | None   # None: a static export (one trace)
    ref_inputs: tuple[torch.Tensor, ...]
    input_names: list[str]
    output_names: list[str]
    config_part: str                 # key into configs (talker, predictor, ...)
    length_axis_note: str            # what "length" means for this module (frames, tokens, samples)
    trace_length: int
    trace_length2: int | None
    ref_length: int
    constructs: list[str] = field(default_factory=list)   # export patches (ported) or HF constructs (raw)
    extra: dict[str, Any] = field(default_factory=dict)   # module-specific facts for the manifest
    # max |this wrapper - the unpatched HF computation| on the reference inputs (torch only):
    # shows that the export patches are exact. None when there is nothing to compare.
    hf_check: Callable[[], float] | None = None


def shapes(tensors: tuple[torch.Tensor, ...]) -> list[list[int]]:
    return [list(t.shape) for t in tensors]


def dtypes(tensors: tuple[torch.Tensor, ...]) -> list[str]:
    return [str(t.dtype).replace("torch.", "") for t in tensors]
