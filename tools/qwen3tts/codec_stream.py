"""The codec decoder as a stream whose per-chunk work does not depend on what came before.

The assembled codec (after fuse-codebooks) is cut into four graphs:

    pre     codes -> per-frame features  (Embeds, 1x1 convs, the level sum: no time context)
    conv    the causal convs before the transformer (pre_conv), add-conv-cache state
    attn    the sliding-window transformer, with a window cache of exactly window-1 rows
    stack   the conv upsampler + vocoder after the transformer, add-conv-cache state

Why not SDPA's native kv cache (add-kvcache) for `attn`: the codec attends over a sliding
window, so a constant-cost stream must drop cache rows older than window-1. ncnn 1.0.20261020's
native cache is a Mat with spare capacity (`cstep / w` rows) that SDPA grows in place, in a
backend-private layout: a cache cropped on the host (numpy round trip, or even `Mat.clone()`,
which changes the capacity) comes back wrong or NaN at the next step (measured on the tiny
codec: rel 0.02 .. NaN), so the native cache can only grow, and attention cost would grow with
it. Here each SDPA instead reads `Concat(window_k_in, k)` / `Concat(window_v_in, v)` (plain
Mats, rotated keys; paramsurgery's `add-window-cache` pass), the concatenations are extra
outputs, and the host keeps their last window-1 rows. The cache is always window-1 rows
(zeros before the stream start, masked out), so every step graph input has a shape fixed by
the chunk size alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.extract import extract_subgraph
from paramsurgery.passes.window_cache import AddWindowCache, WindowSlot


def _context(conv: Any) -> int:
    return (int(conv.params.get(1, 1)) - 1) * int(conv.params.get(2, 1))


def conv_span(front: Graph) -> tuple[str, str]:
    """(first, last) blob of the causal convs that come before the transformer: the input of
    the first context conv's left Padding and the output of the last context conv."""
    ctx = [c for c in front.by_type("Convolution1D") if _context(c) > 0]
    if not ctx:
        raise PassRefused("the codec front has no causal conv with time context")
    first = ctx[0]
    prod = front.producer(first.inputs[0])
    start = prod.inputs[0] if prod is not None and prod.type == "Padding" else first.inputs[0]
    return start, ctx[-1].outputs[0]


@dataclass
class CodecParts:
    pre: tuple[Path, Path]
    conv: dict[str, Any]          # streaming.convert() files
    attn: tuple[Path, Path]
    attn_in: str                  # blob the attention graph starts from
    attn_out: str                 # its output: the transformer's (T, C) frames
    pre_out: str                  # the per-frame features the causal convs start from
    slots: list[WindowSlot]
    window: int
    log: list[str] = field(default_factory=list)


def build(front: Graph, window: int, work: Path,
          save: Callable[[Graph, Path, str, bool], tuple[Path, Path | None]]) -> CodecParts:
    """Cut the codec front into pre / conv / attn and write them (the stack after the front
    is streamed separately, as before)."""
    from paramsurgery.streaming import convert

    start, end = conv_span(front)
    pre = extract_subgraph(front, None, [start])
    leftover = [c.name for c in pre.by_type("Convolution1D") if _context(c) > 0]
    if leftover:
        raise PassRefused(f"{leftover[0]}: a conv with time context before {start} (the "
                          f"per-frame part must have none)")
    conv = extract_subgraph(front, [start], [end])
    rest = [i for i in front.inputs if i not in pre.inputs]
    attn = extract_subgraph(front, [end] + rest, list(front.outputs))
    res = AddWindowCache(window=window)(attn)     # the library pass (its checks included)
    attn, slots = res.graph, res.data["slots"]
    pp, pb = save(pre, work, "codec_pre", True)
    cp, cb = save(conv, work, "codec_preconv", True)
    stream = convert(cp, cb, str(work / "codec_preconv.stream"))
    ap, ab = save(attn, work, "codec_attn", True)
    assert pb is not None and ab is not None
    log = [f"codec stream: pre {len(pre)} layers -> {start}; causal convs {start} -> {end} "
           f"({len(stream.manifest['states'])} add-conv-cache state(s)); attention "
           f"{len(attn)} layers, window cache {window - 1} rows x {len(slots)} SDPA"]
    return CodecParts((pp, pb), {"param": stream.param, "bin": stream.bin,
                                 "manifest": stream.manifest_path,
                                 "start_param": stream.start_param},
                      (ap, ab), end, front.outputs[0], start, slots, window, log)


def window_mask(pos: int, n: int, window: int) -> np.ndarray:
    """(n, window-1+n) additive mask: columns are the cached rows (absolute positions
    pos-window+1 .. pos-1; negative ones are the zero padding before the stream) then the n
    new ones; query pos+i sees keys in (pos+i-window, pos+i]."""
    q = np.arange(pos, pos + n)[:, None]
    k = np.arange(pos - window + 1, pos + n)[None, :]
    ok = (k >= 0) & (k <= q) & (k > q - window)
    return np.where(ok, 0.0, -np.inf).astype(np.float32)


class StreamingCodec:
    """codes in, PCM out, a chunk at a time; `push` does the same work for a chunk of n
    frames wherever it is in the stream (`last_feeds` records the step graph's input shapes)."""

    def __init__(self, parts: CodecParts, stack: dict[str, Any], options: Any,
                 feeds: Callable[[np.ndarray, int], dict[str, Any]], roles: dict[str, str],
                 head_dim: int, theta: float) -> None:
        import ncnn

        from paramsurgery.runtime.child import RunOptions, load_net
        from paramsurgery.streaming import StreamingRunner

        self._ncnn = ncnn
        self.parts = parts
        self.pre = load_net(parts.pre[0], parts.pre[1], options)
        # lightmode off: the window concatenations are read after the output
        attn_opt = RunOptions(num_threads=options.num_threads, light_mode=False,
                              packing=options.packing)
        self.attn = load_net(parts.attn[0], parts.attn[1], attn_opt)
        self.conv = StreamingRunner(parts.conv["param"], parts.conv["bin"],
                                    parts.conv["manifest"], start_param=parts.conv["start_param"],
                                    options=options)
        self.stack = StreamingRunner(stack["param"], stack["bin"], stack["manifest"],
                                     start_param=stack["start_param"], options=options)
        self.feeds = feeds
        self.roles = roles            # "mask" / "cos" / "sin" -> blob of the attention graph
        self.head_dim, self.theta = head_dim, theta
        self.pre_inputs = set(load_graph_inputs(parts.pre[0]))
        self.attn_inputs = load_graph_inputs(parts.attn[0])
        self.timings: list[float] = []
        self.pieces: list[np.ndarray] = []     # every push's PCM since the last reset
        self.reset()

    def reset(self) -> None:
        self.pos = 0
        self.cache: dict[str, np.ndarray] = {}
        self.last_feeds: dict[str, tuple[int, ...]] = {}
        self.pieces = []
        self.conv.reset()
        self.stack.reset()

    def _mat(self, arr: np.ndarray) -> Any:
        return self._ncnn.Mat(np.ascontiguousarray(arr, np.float32)).clone()

    def push(self, codes: np.ndarray) -> np.ndarray:
        from paramsurgery.runtime.child import Fetch, run_net
        from paramsurgery.verify.kvcache import rope_tables

        t = time.perf_counter()
        n = codes.shape[0]
        w = self.parts.window
        feeds = self.feeds(codes, self.pos)
        start = self.parts.pre_out
        x = run_net(self.pre, {k: v for k, v in feeds.items() if k in self.pre_inputs},
                    [Fetch(start)])[start]
        y = self.conv.push(x.reshape(-1, n))
        cos, sin = rope_tables(np.arange(self.pos, self.pos + n), self.head_dim, self.theta)
        r = self.roles
        # the mask goes in 3-D (1, n, window-1+n), as the offline front fed it (its Crop
        # crops axis 2); RoPE tables 2-D (n, d) for the absolute positions
        values = {self.parts.attn_in: y.reshape(-1, n),
                  r["mask"]: window_mask(self.pos, n, w)[None], r["cos"]: cos, r["sin"]: sin}
        hidden = None
        with self.attn.create_extractor() as ex:
            for blob, arr in values.items():
                ex.input(blob, self._mat(arr))
            for s in self.parts.slots:
                for blob in (s.k_in, s.v_in):
                    arr = self.cache.get(blob)
                    if arr is None:     # stream start: window-1 zero rows (masked out)
                        arr = np.zeros(self._cache_shape(ex, s, blob), np.float32)
                        self.cache[blob] = arr
                    ex.input(blob, self._mat(arr))
            self.last_feeds = {b: tuple(a.shape) for b, a in
                               list(values.items()) + [(k, v) for k, v in self.cache.items()]}
            out = self.parts.attn_out
            ret, mat = ex.extract(out)
            if ret != 0:
                raise RuntimeError(f"codec attention: extract {out} returned {ret}")
            hidden = np.array(mat, copy=True).reshape(n, -1)
            for s in self.parts.slots:
                for src, dst in ((s.k_out, s.k_in), (s.v_out, s.v_in)):
                    ret, mat = ex.extract(src)
                    if ret != 0:
                        raise RuntimeError(f"codec attention: extract {src} returned {ret}")
                    full = np.array(mat, copy=True)      # (heads, window-1+n, d)
                    self.cache[dst] = np.ascontiguousarray(full[:, -(w - 1):, :])
        pcm = self.stack.push(hidden).reshape(-1)
        self.pos += n
        self.timings.append(time.perf_counter() - t)
        self.pieces.append(pcm)
        return pcm

    def flush(self) -> np.ndarray:
        tail = self.stack.flush().reshape(-1)
        self.conv.flush()
        self.reset()
        return tail

    def _cache_shape(self, ex: Any, slot: WindowSlot, blob: str) -> tuple[int, int, int]:
        """(heads, window-1, d): the shape of the current keys/values the cache is
        concatenated with (extracting them runs only what they depend on: no cache yet)."""
        src = slot.k_src if blob == slot.k_in else slot.v_src
        ret, mat = ex.extract(src)
        if ret != 0 or mat.dims != 3:
            raise RuntimeError(f"codec attention: {src} (the current keys/values of "
                               f"{slot.sdpa}) is not (heads, T, d): ret {ret}, dims {mat.dims}")
        return (mat.c, self.parts.window - 1, mat.w)


def load_graph_inputs(param: Path) -> list[str]:
    from paramsurgery import load

    return list(load(param).inputs)
