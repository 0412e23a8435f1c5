"""tools/qwen3tts/codec_stream.py: the tiny Qwen3-TTS codec decoded as a stream with a window
cache (sliding-window transformer) and add-conv-cache state, through ncnn, against the offline
decode of the same assembled codec."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from paramsurgery import load  # noqa: E402
from paramsurgery.core.errors import PassRefused  # noqa: E402
from paramsurgery.passes.window_cache import add_window_cache  # noqa: E402

from qwen3tts import assemble, codec_stream  # noqa: E402
from qwen3tts.ncnn_pipeline import Generator  # noqa: E402

FRAMES = 17     # > 4x the tiny codec's window (4): old cache rows must really be dropped
TOL = 5e-5      # max|stream - offline| / max|offline|; measured 4.7e-6 .. 9.5e-6


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pipe = assemble.assemble("tiny", "ported", tmp_path_factory.mktemp("codec-stream"))
    return Generator(pipe, threads=1)


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    return np.random.default_rng(7).integers(0, 32, (FRAMES, 16)).astype(np.int32)


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    assert a.shape == ref.shape
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("chunks", [[1], [2], [3, 1, 5], [4], [FRAMES]])
def test_any_chunking_equals_the_offline_decode(gen: Any, codes: np.ndarray,
                                                chunks: list[int]) -> None:
    offline = gen.decode_offline(codes)
    streamed = gen.decode_streaming(codes, chunks)
    assert _rel(streamed, offline) <= TOL


def test_per_chunk_work_is_constant(gen: Any, codes: np.ndarray) -> None:
    codec = gen.stream_decoder()
    window = codec.parts.window
    shapes = []
    for pos in range(FRAMES):
        codec.push(codes[pos:pos + 1])
        shapes.append(dict(codec.last_feeds))
    # the step graph's inputs at frame 0 and after 16 frames: the same shapes, and every
    # cache is exactly window-1 rows
    assert shapes[0] == shapes[-1]
    caches = {b: s for b, s in shapes[-1].items() if b.startswith("window_")}
    assert len(caches) == 2 * len(codec.parts.slots) == 4
    assert all(s[1] == window - 1 for s in caches.values())
    # nothing else in the attention graph grows: its inputs are the chunk's features, the
    # mask, the RoPE tables and the window caches; no SDPA carries a native (growing) cache
    attn = load(codec.parts.attn[0])
    assert set(attn.inputs) == set(shapes[-1])
    assert all(int(s.params.get(7, 0)) == 0 for s in attn.by_type("SDPA"))
    assert shapes[-1][codec.roles["mask"]] == (1, 1, window - 1 + 1)


def test_window_mask_hides_padding_and_old_rows() -> None:
    m = codec_stream.window_mask(pos=1, n=2, window=4)
    # columns: positions -2, -1, 0 (cache), 1, 2 (new)
    assert np.isinf(m[:, :2]).all()
    assert (m[0] == [-np.inf, -np.inf, 0, 0, -np.inf]).all()
    assert (m[1] == [-np.inf, -np.inf, 0, 0, 0]).all()
    m = codec_stream.window_mask(pos=10, n=1, window=4)
    assert (m == 0).all()


def test_a_native_kv_cache_is_refused(gen: Any) -> None:
    from paramsurgery.passes.kvcache import AddKVCache

    front = load(gen.pipe.codec_front.param, bin=gen.pipe.codec_front.bin)
    cached = AddKVCache()(front).graph
    with pytest.raises(PassRefused, match=r"sdpa_\d+: expected q, k, v, mask and no kv cache"):
        add_window_cache(cached, 4)


def test_the_check_tool_passes_and_can_fail(capsys: pytest.CaptureFixture[str]) -> None:
    import codec_stream_check

    assert codec_stream_check.main(["--frames", "9", "--chunks", "1", "2,3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("codec stream (tiny, window 4, 9 frames): worst rel ")
    # the stream differs from offline by float noise, so a zero tolerance must fail
    assert codec_stream_check.main(["--frames", "9", "--chunks", "1", "--tol", "0"]) == 1
