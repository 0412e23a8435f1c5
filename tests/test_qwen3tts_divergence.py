"""tools/qwen3tts/divergence.py: where ncnn's and torch's greedy codes part, and whether the
first difference is a near tie (named with torch's top-2 gap) or a defect."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from qwen3tts import divergence  # noqa: E402

FRAMES, GROUPS, V, V2 = 3, 4, 12, 8
BANNED = np.asarray([10, 11])          # talker ids greedy never picks
NONE = np.asarray([], np.int64)


def _case(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    talker = rng.standard_normal((FRAMES, V)).astype(np.float32)
    talker[:, BANNED] = 50.0           # the largest logits, but suppressed
    pred = rng.standard_normal((FRAMES, GROUPS - 1, V2)).astype(np.float32)
    masked = talker.copy()
    masked[:, BANNED] = -np.inf
    codes = np.concatenate([masked.argmax(-1)[:, None], pred.argmax(-1)], 1).astype(np.int32)
    return talker, pred, codes


def _ncnn_logits(talker: np.ndarray, pred: np.ndarray, noise: float = 1e-6
                 ) -> dict[str, list[np.ndarray]]:
    # what Generator(keep_logits=True) records: a talker row per frame, then 15 (here 3)
    # predictor rows per frame in order
    return {"talker": [r + noise for r in talker],
            "predictor": [pred[f, g] + noise for f in range(FRAMES) for g in range(GROUPS - 1)]}


def test_identical_codes_compare_every_choice() -> None:
    talker, pred, codes = _case()
    cmp = divergence.compare(codes, codes, _ncnn_logits(talker, pred), talker, pred, BANNED, NONE)
    assert (cmp.matching, cmp.divergence, cmp.choices) == (FRAMES, None, FRAMES * GROUPS)
    assert 0 < cmp.logit_rel < 1e-5 and cmp.ok()


def test_a_near_tie_is_named_with_its_gap() -> None:
    talker, pred, codes = _case()
    f, g = 1, 2
    row = pred[f, g - 1]
    second = int(np.argsort(row)[-2])
    row[second] = row[codes[f, g]] - 1e-6          # torch: top-2 within fp32 noise
    ncnn = codes.copy()
    ncnn[f, g] = second
    cmp = divergence.compare(ncnn, codes, _ncnn_logits(talker, pred), talker, pred, BANNED,
                             NONE)
    d = cmp.divergence
    assert cmp.matching == f and d is not None and (d.frame, d.group) == (f, g)
    assert (d.ncnn_code, d.torch_code) == (second, codes[f, g])
    assert d.near_tie and cmp.ok() and 0 < d.gap < 2e-6
    assert cmp.choices == f * GROUPS + g            # nothing after the divergence compared
    assert "near tie" in d.describe() and "frame 1 group 2" in d.describe()


def test_a_clear_gap_is_a_defect() -> None:
    talker, pred, codes = _case()
    ncnn = codes.copy()
    ncnn[0, 0] = int(np.argsort(np.where(np.isin(np.arange(V), BANNED), -np.inf,
                                         talker[0]))[-2])
    cmp = divergence.compare(ncnn, codes, _ncnn_logits(talker, pred), talker, pred, BANNED,
                             NONE)
    d = cmp.divergence
    assert d is not None and (d.frame, d.group) == (0, 0) and not d.near_tie and not cmp.ok()
    assert cmp.matching == 0 and "DEFECT" in d.describe()


def test_suppressed_ids_are_not_the_scale() -> None:
    # the banned ids carry the largest logits (50): a tie tolerance relative to them would
    # call a clear gap a tie
    talker, pred, codes = _case()
    ncnn = codes.copy()
    masked = np.where(np.isin(np.arange(V), BANNED), -np.inf, talker[0])
    ncnn[0, 0] = int(np.argsort(masked)[-2])
    d = divergence.compare(ncnn, codes, _ncnn_logits(talker, pred), talker, pred, BANNED,
                           NONE, tie_tol=0.01).divergence
    assert d is not None and d.scale < 50 and not d.near_tie
