"""Where greedy codes of ncnn and torch part, and whether that is a defect or a near tie.

Both sides choose every code by argmax over logits (suppressed ids excluded). While the
codes agree, both sides computed the same step from the same inputs, so their logits can be
compared directly; at the first code that differs the torch logits say how close the two
choices were. A random-init real-size model can have a top-2 gap below fp32 noise (ncnn and
torch sum in different orders), where either choice is right: a *near tie*, named with its
gap. A divergence with a clear gap is a defect. After a divergence the two sequences are
conditioned on different codes, so nothing after it is compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TIE_TOL = 1e-4   # near tie: torch's gap between the two choices <= TIE_TOL * max|logits|


@dataclass
class Divergence:
    frame: int
    group: int              # 0: the talker's code 0; 1..15: the code predictor's groups
    ncnn_code: int
    torch_code: int
    gap: float              # torch logit of its choice - torch logit of ncnn's choice
    scale: float            # max |torch logits| at that step
    noise: float            # max |ncnn - torch| logits at that step
    near_tie: bool

    def describe(self) -> str:
        kind = "near tie" if self.near_tie else "DEFECT (clear gap)"
        return (f"frame {self.frame} group {self.group}: ncnn {self.ncnn_code} / torch "
                f"{self.torch_code}, torch top-2 gap {self.gap:.3e} ({self.gap / self.scale:.1e}"
                f" of max|logit| {self.scale:.2f}; ncnn-torch logit diff there "
                f"{self.noise:.2e}): {kind}")


@dataclass
class Comparison:
    frames: int
    matching: int                       # frames whose 16 codes agree, from the start
    divergence: Divergence | None
    logit_rel: float                    # max over the agreeing choices of max|d| / max|ref|
    choices: int                        # agreeing choices compared

    def ok(self) -> bool:
        return self.divergence is None or self.divergence.near_tie


def _masked(row: np.ndarray, banned: np.ndarray) -> np.ndarray:
    out = np.asarray(row, np.float64).copy()
    if banned.size:
        out[banned] = -np.inf
    return out


def compare(ncnn_codes: np.ndarray, torch_codes: np.ndarray,
            ncnn_logits: dict[str, list[np.ndarray]], torch_talker: np.ndarray,
            torch_predictor: np.ndarray, talker_banned: np.ndarray,
            predictor_banned: np.ndarray, tie_tol: float = TIE_TOL) -> Comparison:
    """`ncnn_logits`: `Generator.logits` (talker rows per frame, 15 predictor rows per frame
    in order); `torch_talker` (frames, V), `torch_predictor` (frames, 15, V2)."""
    frames = min(len(ncnn_codes), len(torch_codes))
    groups = torch_codes.shape[1]
    worst, choices = 0.0, 0
    for f in range(frames):
        for g in range(groups):
            if g == 0:
                n_row, t_row, banned = ncnn_logits["talker"][f], torch_talker[f], talker_banned
            else:
                n_row = ncnn_logits["predictor"][f * (groups - 1) + g - 1]
                t_row, banned = torch_predictor[f, g - 1], predictor_banned
            t = _masked(t_row, banned)
            keep = np.isfinite(t)
            scale = float(np.max(np.abs(t[keep]))) or 1.0
            noise = float(np.max(np.abs(np.asarray(n_row, np.float64)[keep] - t[keep])))
            nc, tc = int(ncnn_codes[f, g]), int(torch_codes[f, g])
            if nc != tc:
                gap = float(t[tc] - t[nc])
                return Comparison(frames, f, Divergence(f, g, nc, tc, gap, scale, noise,
                                                        gap <= tie_tol * scale), worst, choices)
            worst = max(worst, noise / scale)
            choices += 1
    return Comparison(frames, frames, None, worst, choices)
