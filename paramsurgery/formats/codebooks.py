"""The fused-codebooks manifest (`model.fused.json`): what a runtime needs to feed a graph
`paramsurgery fuse-codebooks` wrote. Each `Fusion` says which Embeds became one, the id
input, each group's vocabulary and offset, and packs per-group codes into the fused input
(`pack_ids`: group-major, offset, range-checked: ncnn would clamp an out-of-range id into
another group's rows). The pass is `passes/fuse_codebooks.py`, its proof `codebooks_verify`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

MANIFEST_FORMAT = "paramsurgery/fused-codebooks"
MANIFEST_VERSION = 1


# ============================================================================ the record

@dataclass
class CodebookGroup:
    index: int
    embed: str  # the original Embed layer
    input: str  # its id input blob
    vocab: int
    offset: int
    bias: bool = False
    output: str | None = None  # split mode: the blob holding this group's rows


@dataclass
class Fusion:
    """One fused lookup: what the caller feeds and what the graph returns."""

    embed: str
    mode: str  # "sum" | "split"
    input: str
    dim: int
    groups: list[CodebookGroup] = field(default_factory=list)
    output: str | None = None  # sum mode: the blob holding the sum (same name as before)
    removed_inputs: list[str] = field(default_factory=list)
    dtype: str = "fp32"

    @property
    def input_dim(self) -> int:
        return sum(g.vocab for g in self.groups)

    @property
    def offsets(self) -> list[int]:
        return [g.offset for g in self.groups]

    @property
    def vocab_sizes(self) -> list[int]:
        return [g.vocab for g in self.groups]

    def to_json(self) -> dict[str, Any]:
        n = len(self.groups)
        out: dict[str, Any] = {
            "embed": self.embed,
            "mode": self.mode,
            "num_groups": n,
            "dim": self.dim,
            "input_dim": self.input_dim,
            "table_dtype": self.dtype,
            "vocab_sizes": self.vocab_sizes,
            "offsets": self.offsets,
            "groups": [asdict(g) for g in self.groups],
            "input": {
                "blob": self.input,
                "dtype": "int32",
                "rank": 1,
                "length": f"{n} * T",
                "layout": "group-major",
                "formula": "ids[g * T + t] = code[g][t] + offsets[g], 0 <= code[g][t] < "
                           "vocab_sizes[g]; every group has the same T",
            },
            "removed_inputs": self.removed_inputs,
        }
        if self.mode == "sum":
            out["output"] = {"blob": self.output, "layout": "the unfused graph's sum blob, same "
                             "name and shape: sum over g of group g's rows (T, dim) [then the "
                             "branches' common layout chain]"}
        else:
            out["output"] = {"blobs": [g.output for g in self.groups],
                             "layout": "blob g = rows g*T .. g*T+T-1 of the lookup = group g's "
                                       "embeddings (T, dim), the unfused Embed's output"}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Fusion":
        f = cls(embed=d["embed"], mode=d["mode"], input=d["input"]["blob"], dim=d["dim"],
                groups=[CodebookGroup(**g) for g in d["groups"]],
                output=d["output"].get("blob"), removed_inputs=list(d["removed_inputs"]),
                dtype=d.get("table_dtype", "fp32"))
        if f.offsets != list(d["offsets"]) or f.vocab_sizes != list(d["vocab_sizes"]):
            raise ValueError("manifest offsets/vocab_sizes disagree with its groups")
        return f

    # ------------------------------------------------------------------ caller side
    def pack_ids(self, codes: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
        """Group-major, offset int32 ids from per-group codes `codes[g][t]` (shape (N, T)).
        Refuses codes outside a group's vocabulary (ncnn would clamp them into another
        group's rows)."""
        arr = np.asarray(codes)
        n = len(self.groups)
        if arr.ndim != 2 or arr.shape[0] != n:
            raise ValueError(f"codes must be (num_groups={n}, T), got {arr.shape}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"codes must be integers, got {arr.dtype}")
        vocab = np.array(self.vocab_sizes)[:, None]
        bad = (arr < 0) | (arr >= vocab)
        if bad.any():
            g, t = map(int, np.argwhere(bad)[0])
            raise ValueError(f"code {int(arr[g, t])} of group {g} (t={t}) is outside its "
                             f"vocabulary [0, {self.vocab_sizes[g]})")
        ids = arr.astype(np.int64) + np.array(self.offsets)[:, None]
        return np.ascontiguousarray(ids.reshape(-1).astype(np.int32))

    def unpack_rows(self, rows: np.ndarray) -> np.ndarray:
        """The fused lookup's rows (N*T, dim) → (N, T, dim)."""
        rows = np.asarray(rows)
        return rows.reshape(len(self.groups), -1, rows.shape[-1])


@dataclass
class FusedManifest:
    """`model.fused.json`: everything a runtime needs to feed the fused graph."""

    fusions: list[Fusion]
    param: str | None = None
    bin: str | None = None
    source_param: str | None = None
    source_bin: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
                "param": self.param, "bin": self.bin,
                "source": {"param": self.source_param, "bin": self.source_bin},
                "fusions": [f.to_json() for f in self.fusions]}

    def dumps(self) -> str:
        """Indented JSON with lists of numbers on one line."""
        import re

        text = json.dumps(self.to_json(), indent=2)
        text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
                      lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                      text)
        return text + "\n"

    @classmethod
    def loads(cls, text: str) -> "FusedManifest":
        d = json.loads(text)
        if d.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a fused-codebooks manifest (format {d.get('format')!r})")
        if d.get("version") != MANIFEST_VERSION:
            raise ValueError(f"unsupported manifest version {d.get('version')!r}")
        return cls([Fusion.from_json(f) for f in d["fusions"]], d.get("param"), d.get("bin"),
                   d["source"].get("param"), d["source"].get("bin"))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "FusedManifest":
        with open(path, encoding="utf-8") as fh:
            return cls.loads(fh.read())

    def fusion(self, key: str) -> Fusion:
        """A fusion by its Embed name or input blob."""
        for f in self.fusions:
            if key in (f.embed, f.input):
                return f
        raise KeyError(key)

    def feeds(self, codes: Mapping[str, Sequence[Sequence[int]] | np.ndarray]) -> dict[str, np.ndarray]:
        """{input blob: packed ids} from {input blob or embed name: codes (N, T)}."""
        return {self.fusion(k).input: self.fusion(k).pack_ids(v) for k, v in codes.items()}
