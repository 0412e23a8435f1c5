"""The proof of a codebook fusion: the unfused graph (one id input per group) and the fused
one (offset, group-major ids packed by the manifest) through ncnn on the same random codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from paramsurgery.formats.codebooks import FusedManifest
from paramsurgery.core.errors import PassRefused


@dataclass
class FusionCheck:
    lengths: list[int]
    blobs: dict[str, float] = field(default_factory=dict)  # "blob@T" -> max rel
    tol: float = 1e-6

    @property
    def ok(self) -> bool:
        return bool(self.blobs) and all(v <= self.tol for v in self.blobs.values())

    def format(self) -> str:
        lines = [f"fused vs unfused through ncnn (random in-range codes, offset group-major ids; "
                 f"tolerance rel {self.tol:g})"]
        for T in self.lengths:
            vals = {k.rsplit("@", 1)[0]: v for k, v in self.blobs.items()
                    if k.endswith(f"@T={T}")}
            if not vals:
                continue
            worst = max(vals, key=vals.__getitem__)
            what = worst if len(vals) == 1 else f"{len(vals)} blobs (worst {worst})"
            v = vals[worst]
            lines.append(f"  T={T:<4} {what:<32} max rel {v:.3e}  "
                         f"{'ok' if v <= self.tol else 'MISMATCH'}")
        lines.append("  parity: " + ("ok" if self.ok else "FAILED"))
        return "\n".join(lines)


def verify_fusion(orig_param: str, orig_bin: str, fused_param: str, fused_bin: str,
                  manifest: FusedManifest, lengths: Iterable[int] = (1, 7, 13), seed: int = 0,
                  tol: float = 1e-6) -> FusionCheck:
    """Run the unfused graph (one id input per group) and the fused graph (offset,
    group-major ids from `manifest`) on the same random codes and compare the sum blob
    (sum mode) or every group's rows (split mode). Only the id inputs are fed: the compared
    blobs depend on nothing else. Both run in child processes."""
    from paramsurgery.runtime.child import Feed, run_isolated

    rng = np.random.default_rng(seed)
    check = FusionCheck(list(lengths), tol=tol)
    for T in check.lengths:
        for f in manifest.fusions:
            codes = np.stack([rng.integers(0, gr.vocab, T) for gr in f.groups])
            orig_feeds = {gr.input: Feed(codes[i].astype(np.int32)) for i, gr in
                          enumerate(f.groups)}
            fused_feeds = {f.input: Feed(f.pack_ids(codes))}
            named = [f.output] if f.mode == "sum" else [gr.output for gr in f.groups]
            blobs = [b for b in named if b is not None]
            a = run_isolated(orig_param, orig_bin, orig_feeds, blobs)
            b = run_isolated(fused_param, fused_bin, fused_feeds, blobs)
            if not a.ok:
                raise PassRefused(f"the unfused graph does not run: {a.describe()}",
                                  file=orig_param)
            if not b.ok:
                raise PassRefused(f"the fused graph does not run: {b.describe()}",
                                  file=fused_param)
            for blob in blobs:
                x, y = a.outputs[blob], b.outputs[blob]
                key = f"{blob}@T={T}"
                if x.shape != y.shape:
                    check.blobs[key] = float("inf")
                    continue
                scale = float(np.max(np.abs(x))) if x.size else 0.0
                diff = float(np.max(np.abs(x.astype(np.float64) - y))) if x.size else 0.0
                check.blobs[key] = diff / scale if scale else diff
    return check
