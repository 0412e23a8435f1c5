"""Which repair pass rewrites which converter leftover (`pnnx.*`, `Tensor.*`, `torch.*`,
...): data, so lint's PS004 can name the fix without importing the passes (lint and passes
are siblings). Each pass still decides by its own `claims(layer)`;
`tests/test_contracts.py::test_claims_table_is_what_the_passes_claim` keeps this table equal
to what they claim (the first repair in `fix`'s order wins a type two passes claim)."""

from __future__ import annotations

CLAIMS: dict[str, str] = {
    # causal-mask
    "Tensor.triu": "causal-mask", "aten::triu": "causal-mask", "torch.full": "causal-mask",
    "torch.triu": "causal-mask",
    # fix-slice
    "Tensor.unbind": "fix-slice", "torch.unbind": "fix-slice",
    # lower
    "F.pad": "lower", "F.rrelu": "lower", "F.softmin": "lower", "F.softsign": "lower",
    "F.tanhshrink": "lower", "Tensor.clamp": "lower", "Tensor.double": "lower",
    "Tensor.eq": "lower", "Tensor.expand": "lower", "Tensor.float": "lower", "Tensor.ge": "lower",
    "Tensor.gt": "lower", "Tensor.int": "lower", "Tensor.le": "lower", "Tensor.long": "lower",
    "Tensor.lt": "lower", "Tensor.masked_fill": "lower", "Tensor.narrow": "lower",
    "Tensor.ne": "lower", "Tensor.repeat": "lower", "Tensor.slice": "lower",
    "Tensor.slice_copy": "lower", "Tensor.to": "lower", "aten::addcdiv": "lower",
    "aten::addcmul": "lower", "aten::clamp_max": "lower", "aten::clamp_min": "lower",
    "aten::deg2rad": "lower", "aten::expand": "lower", "aten::frac": "lower", "aten::lerp": "lower",
    "aten::mT": "lower", "aten::masked_fill": "lower", "aten::rad2deg": "lower",
    "aten::repeat": "lower", "aten::to": "lower", "torch.arange": "lower", "torch.clamp": "lower",
    "torch.eq": "lower", "torch.ge": "lower", "torch.gt": "lower", "torch.le": "lower",
    "torch.lt": "lower", "torch.narrow": "lower", "torch.ne": "lower",
    "aten::where": "lower", "torch.where": "lower",
    # remove-passthrough
    "F.alpha_dropout": "remove-passthrough", "F.dropout": "remove-passthrough",
    "F.dropout1d": "remove-passthrough", "F.dropout2d": "remove-passthrough",
    "F.dropout3d": "remove-passthrough", "F.feature_alpha_dropout": "remove-passthrough",
    "Tensor.bfloat16": "remove-passthrough", "Tensor.clone": "remove-passthrough",
    "Tensor.contiguous": "remove-passthrough", "Tensor.detach": "remove-passthrough",
    "Tensor.half": "remove-passthrough", "Tensor.type": "remove-passthrough",
    "aten::alias": "remove-passthrough", "aten::clone": "remove-passthrough",
    "aten::contiguous": "remove-passthrough", "aten::detach": "remove-passthrough",
    "nn.AlphaDropout": "remove-passthrough", "nn.Dropout": "remove-passthrough",
    "nn.Dropout1d": "remove-passthrough", "nn.Dropout2d": "remove-passthrough",
    "nn.Dropout3d": "remove-passthrough", "nn.FeatureAlphaDropout": "remove-passthrough",
    "nn.Identity": "remove-passthrough", "torch.clone": "remove-passthrough",
    "torch.detach": "remove-passthrough",
}


def repair_for(layer_type: str) -> str | None:
    """The repair pass that rewrites a converter leftover of this type, or None."""
    return CLAIMS.get(layer_type)
