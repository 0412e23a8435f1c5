"""Qwen3-TTS generation on ncnn (no torch): the host loop of the reference C++ port, in
Python, over the nets `assemble.py` builds.

Per utterance: prompt embeddings (text embed + codec embed + speaker x-vector, laid out as
`Qwen3TTSForConditionalGeneration.generate` does for an x-vector voice-clone prompt in
streaming-text mode), one talker prefill, then per frame: the code predictor's 15 groups
with its own kv cache (prefill of [talker hidden, codec embed of code 0], then 14 cached
steps), the frame's feedback embedding (codec embed of code 0 + the fused 15-table sum) plus
the next text row, one cached talker step, greedy code 0 of the next frame. Codec decoding
runs offline (all frames at once) and as a stream of constant per-chunk cost
(`codec_stream.py`: window cache on the transformer, `add-conv-cache` state on the convs).

Tensors follow the fixtures' conventions: ids int32, float rows (T, D); the SDPA kv caches
are extracted raw (type 1) and fed back as ncnn returned them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramsurgery.verify.kvcache import causal_mask, rope_tables
from paramsurgery.runtime.child import Feed, Fetch, RunOptions, load_net, run_net

from .assemble import Part, Pipeline


def _conform(array: np.ndarray, ref_shape: Sequence[int]) -> np.ndarray:
    """`array` (the logical (T, D) / (T,) value) broadcast to the rank of the module's
    reference input: leading axes of the reference shape are prepended (size 1, or the
    3 identical M-RoPE streams)."""
    extra = len(ref_shape) - array.ndim
    if extra <= 0:
        return array
    return np.ascontiguousarray(np.broadcast_to(array, tuple(ref_shape[:extra]) + array.shape))


def sliding_causal_mask(length: int, window: int) -> np.ndarray:
    """(length, length) additive mask: query i sees keys i-window+1 .. i (the codec
    transformer's sliding window, as `qwen3tts/masks.py` builds it for torch)."""
    q = np.arange(length)[:, None]
    k = np.arange(length)[None, :]
    return np.where((k <= q) & (k > q - window), 0.0, -np.inf).astype(np.float32)


class Net:
    """A loaded net fed and read with its module's manifest `io` (pnnx blob names and
    batch axes)."""

    def __init__(self, part: Part, options: RunOptions) -> None:
        self.part = part
        self.net = load_net(part.param, part.bin, options)
        self.inputs = part.io["inputs"]
        self.outputs = {o["blob"]: o for o in part.io["outputs"]}

    def feed(self, index: int, value: np.ndarray) -> tuple[str, Feed]:
        """Input `index` in the reference's rank and batch axis (how the fixture check fed it)."""
        spec, ref = self.inputs[index], self.part.ref_shapes[index]
        arr = _conform(value, ref)
        return spec["blob"], Feed(arr, spec["batch_index"] if arr.ndim == len(ref) else 233)

    def __call__(self, *values: np.ndarray, output: str = "out0") -> np.ndarray:
        feeds = dict(self.feed(i, v) for i, v in enumerate(values))
        return self.run(feeds, output)

    def run(self, feeds: dict[str, Any], output: str = "out0") -> np.ndarray:
        spec = self.outputs.get(output, {"batch_index": 233})
        return run_net(self.net, feeds, [Fetch(output, spec["batch_index"])])[output]


class CachedDecoder:
    """A decoder stack with SDPA's native kv cache (add-kvcache): `step(rows)` runs the next
    len(rows) positions; `reset()` starts a new sequence."""

    def __init__(self, part: Part, options: RunOptions, head_dim: int, theta: float) -> None:
        import ncnn

        self._ncnn = ncnn
        self.part = part
        self.net = load_net(part.param, part.bin, options)
        self.slots = part.extra["slots"]
        by_name = {i["name"]: (k, i) for k, i in enumerate(part.io["inputs"])}
        order = [by_name[n] for n in ("embeds", "mask", "cos", "sin")]
        self.names = [i["blob"] for _, i in order]
        self.rope_shapes = [part.ref_shapes[k] for k, _ in order[2:]]
        self.rope_batch = [i["batch_index"] for _, i in order[2:]]
        self.head_dim, self.theta = head_dim, theta
        self.reset()

    def reset(self) -> None:
        self.past = 0
        self.cache: dict[str, Any] = {}

    def _mat(self, arr: np.ndarray, batch_index: int = 233) -> Any:
        arr = np.ascontiguousarray(arr, np.float32)
        if batch_index != 233:
            return self._ncnn.Mat(arr, batch_index=batch_index).clone()
        return self._ncnn.Mat(arr).clone()

    def step(self, rows: np.ndarray) -> np.ndarray:
        n = rows.shape[0]
        cos, sin = rope_tables(np.arange(self.past, self.past + n), self.head_dim, self.theta)
        with self.net.create_extractor() as ex:
            ex.input(self.names[0], self._mat(rows))
            ex.input(self.names[1], self._mat(causal_mask(n, self.past)))
            for name, table, ref, bidx in zip(self.names[2:4], (cos, sin), self.rope_shapes,
                                              self.rope_batch):
                # plain RoPE tables go in 2-D; the raw talker's M-RoPE streams with their axes
                if any(d != 1 for d in ref[:len(ref) - 2]):
                    ex.input(name, self._mat(_conform(table, ref), bidx))
                else:
                    ex.input(name, self._mat(table))
            for k_in, v_in, _, _ in self.slots:
                ex.input(k_in, self.cache.get(k_in, self._ncnn.Mat()))
                ex.input(v_in, self.cache.get(v_in, self._ncnn.Mat()))
            ret, out = ex.extract("out0")
            if ret != 0:
                raise RuntimeError(f"{self.part.name}: extract out0 returned {ret}")
            hidden = np.array(out, copy=True).reshape(n, -1)
            for k_in, v_in, k_out, v_out in self.slots:
                for src, dst in ((k_out, k_in), (v_out, v_in)):
                    ret, mat = ex.extract(src, 1)   # backend-private layout: feed back as is
                    if ret != 0:
                        raise RuntimeError(f"{self.part.name}: extract {src} returned {ret}")
                    self.cache[dst] = mat
        self.past += n
        return hidden


@dataclass
class Settings:
    """What the generation follows (read from e2e.ref.npz's `meta_*` keys, the settings the
    torch reference ran with)."""

    frames: int
    hidden: int
    tts_bos_eos_pad: list[int]
    codec_think: list[int]
    codec_pad_bos: list[int]
    codec_eos: int
    talker_banned: np.ndarray       # suppressed ids + EOS (min_new_tokens covers every frame)
    predictor_banned: np.ndarray
    groups: int

    @classmethod
    def from_npz(cls, ref: dict[str, np.ndarray]) -> Settings:
        eos = int(ref["meta_codec_eos"][0])
        pred = ref["meta_predictor_suppress"]
        return cls(frames=int(ref["meta_frames"][0]), hidden=int(ref["meta_hidden"][0]),
                   tts_bos_eos_pad=ref["meta_tts_bos_eos_pad"].tolist(),
                   codec_think=ref["meta_codec_think"].tolist(),
                   codec_pad_bos=ref["meta_codec_pad_bos"].tolist(), codec_eos=eos,
                   talker_banned=np.append(ref["meta_talker_suppress"], eos),
                   predictor_banned=pred[pred >= 0], groups=int(ref["meta_groups"][0]))


def pack_groups(fusion: Any, part: Part, values: dict[str, np.ndarray]) -> np.ndarray:
    """A fused Embed's id input (fuse-codebooks' caller contract): each group's codes, found
    by the name of the id input it replaced (`io` of the unfused module), packed
    group-major with the group offsets."""
    name_of = {i["blob"]: i["name"] for i in part.io["inputs"]}
    return fusion.pack_ids(np.stack([values[name_of[g.input]] for g in fusion.groups]))


def greedy(logits: np.ndarray, banned: np.ndarray) -> int:
    row = np.array(logits, np.float32).reshape(-1).copy()
    row[banned] = -np.inf
    return int(np.argmax(row))


def codec_feeds(front: dict[str, Any], part: Part, fusion: Any, codes: np.ndarray,
                start: int) -> dict[str, Any]:
    """Inputs of the codec graph (or its front) for frames start..start+T-1, by the
    module's input names: codes_level<i> / codes (1, 16, T) ids, the fused acoustic ids,
    the sliding-window mask, RoPE tables for positions start.."""
    T = codes.shape[0]
    cos, sin = rope_tables(np.arange(start, start + T), int(front["head_dim"]),
                           float(front["rope_theta"]))
    values = {"codes": codes.T, "mask": sliding_causal_mask(T, int(front["window"])),
              "cos": cos, "sin": sin}
    values.update({f"codes_level{i}": codes[:, i] for i in range(codes.shape[1])})
    feeds: dict[str, Any] = {}
    if fusion is not None:
        feeds[fusion.input] = pack_groups(fusion, part, values)
    for spec, ref in zip(part.io["inputs"], part.ref_shapes):
        if fusion is not None and spec["blob"] in {g.input for g in fusion.groups}:
            continue
        value = values[spec["name"]]
        value = value.astype(np.int32) if spec["name"].startswith("codes") else value
        feeds[spec["blob"]] = Feed(_conform(value, ref), spec["batch_index"])
    return feeds


@dataclass
class Timing:
    prompt: float = 0.0
    per_frame: list[float] = field(default_factory=list)   # talker + predictor per frame
    per_frame_cpu: list[float] = field(default_factory=list)  # process CPU time, all threads
    codec_offline: float = 0.0
    codec_chunks: list[float] = field(default_factory=list)
    codec_stream_chunks: list[float] = field(default_factory=list)
    predictor_group: list[float] = field(default_factory=list)  # 15 groups + feedback sum
    talker_step: list[float] = field(default_factory=list)      # one cached step + codec head
    first_audio: float | None = None   # text ids in -> first PCM out (streaming run)


class Generator:
    """The whole pipeline on ncnn."""

    def __init__(self, pipe: Pipeline, threads: int = 2,
                 options: RunOptions | None = None, keep_logits: bool = False) -> None:
        # `options`: every net's run options (default fp32 at `threads`; a reduced-precision
        # build passes its own: tools/qwen3tts_precision_e2e.py). `keep_logits`: every
        # greedy choice's logits go to `self.logits` ("talker": code 0 of each frame,
        # "predictor": codes 1..15 of each frame), to judge a divergence from torch
        options = options or RunOptions(num_threads=threads)
        p = pipe.parts
        self.pipe = pipe
        self.text_embed = Net(p["text_embed"], options)
        self.codec_embed = Net(p["codec_embed"], options)
        self.codec_head = Net(p["codec_head"], options)
        self.rows = Net(p["predictor_rows"], options)
        self.heads = Net(p["predictor_heads"], options)
        self.speaker = Net(p["speaker"], options)
        self.feedback = Net(p["feedback_sum"], options)
        self.feedback_fusion = p["feedback_sum"].extra.get("fusion")   # None: the raw HF sum
        self.codec = Net(p["codec"], options)
        self.codec_fusion = p["codec"].extra.get("fusion")
        self.front = Net(pipe.codec_front, options)
        talker_conv = p["talker"].extra["convention"]
        pred_conv = p["predictor"].extra["convention"]
        self.talker = CachedDecoder(p["talker"], options, int(talker_conv["head_dim"]),
                                    float(talker_conv["rope_theta"]))
        self.predictor = CachedDecoder(p["predictor"], options, int(pred_conv["head_dim"]),
                                       float(pred_conv["rope_theta"]))
        self.predictor_vocab = int(p["predictor_rows"].extra["vocab"])
        self.options = options
        self.timing = Timing()
        self.logits: dict[str, list[np.ndarray]] | None = \
            {"talker": [], "predictor": []} if keep_logits else None

    def _choose(self, logits: np.ndarray, banned: np.ndarray, which: str) -> int:
        if self.logits is not None:
            self.logits[which].append(np.array(logits, np.float32).reshape(-1))
        return greedy(logits, banned)

    # ------------------------------------------------------------------ embeddings
    def embed_text(self, ids: Sequence[int]) -> np.ndarray:
        return self.text_embed(np.asarray(ids, np.int32)).reshape(len(ids), -1)

    def embed_codec(self, ids: Sequence[int]) -> np.ndarray:
        return self.codec_embed(np.asarray(ids, np.int32)).reshape(len(ids), -1)

    def xvector(self, mels: np.ndarray) -> np.ndarray:
        return self.speaker(mels.reshape(mels.shape[-2:])).reshape(-1)

    def prompt(self, text_ids: np.ndarray, speaker: np.ndarray, s: Settings
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prompt rows, trailing text rows, tts_pad row), laid out as HF's generate does for
        an x-vector prompt with a language id and streaming text."""
        bos, eos, pad = self.embed_text(s.tts_bos_eos_pad)
        codec_in = np.concatenate([self.embed_codec(s.codec_think), speaker[None],
                                   self.embed_codec(s.codec_pad_bos)])
        role = self.embed_text(text_ids[:3])
        n = codec_in.shape[0]
        tags = np.concatenate([np.repeat(pad[None], n - 2, 0), bos[None]]) + codec_in[:-1]
        first = self.embed_text(text_ids[3:4]) + codec_in[-1:]
        trailing = np.concatenate([self.embed_text(text_ids[4:-5]), eos[None]])
        return np.concatenate([role, tags, first]), trailing, pad

    # ------------------------------------------------------------------ generation
    def frame_codes(self, past_hidden: np.ndarray, code0: int, s: Settings
                    ) -> tuple[list[int], np.ndarray]:
        """The 15 residual codes of one frame (code predictor, own cache) and the frame's
        feedback embedding."""
        e0 = self.embed_codec([code0])
        self.predictor.reset()
        out = self.predictor.step(np.concatenate([past_hidden[None], e0]))[-1:]
        codes = [code0]
        V = self.predictor_vocab
        for g in range(s.groups - 1):
            code = self._choose(self.heads(out, output=f"out{g}"), s.predictor_banned,
                                "predictor")
            codes.append(code)
            if g < s.groups - 2:
                row = self.rows(np.asarray([code + g * V], np.int32)).reshape(1, -1)
                out = self.predictor.step(row)
        residual = np.asarray(codes[1:], np.int32)
        if self.feedback_fusion is None:      # raw: the HF feedback sum on (1, 15) codes
            summed = self.feedback(residual[None])
        else:
            ids = pack_groups(self.feedback_fusion, self.feedback.part,
                              {f"codes_group{g + 1}": residual[g:g + 1]
                               for g in range(len(residual))})
            summed = self.feedback.run({self.feedback_fusion.input: ids})
        return codes, e0 + summed.reshape(1, -1)

    def generate(self, text_ids: np.ndarray, mels: np.ndarray, s: Settings,
                 frames: int, on_frame: Callable[[np.ndarray], np.ndarray] | None = None
                 ) -> dict[str, np.ndarray]:
        """Greedy codes for `frames` frames. `on_frame(codes (1, 16))` runs after each frame
        (outside the per-frame timing) and returns PCM; the time from entry (text ids in) to
        the first non-empty PCM it returns is `timing.first_audio`."""
        t0 = time.perf_counter()
        xvec = self.xvector(mels)
        speaker = np.zeros(s.hidden, np.float32)
        speaker[:xvec.shape[0]] = xvec[:s.hidden]
        prompt, trailing, pad = self.prompt(text_ids, speaker, s)
        self.talker.reset()
        hidden = self.talker.step(prompt)
        code0 = self._choose(self.codec_head(hidden[-1:]), s.talker_banned, "talker")
        past = hidden[-1]
        self.timing.prompt = time.perf_counter() - t0
        codes = []
        for i in range(frames):
            t, cpu = time.perf_counter(), time.process_time()
            frame, feedback = self.frame_codes(past, code0, s)
            codes.append(frame)
            t_talker = time.perf_counter()
            self.timing.predictor_group.append(t_talker - t)
            text = trailing[i:i + 1] if i < trailing.shape[0] else pad[None]
            hidden = self.talker.step(feedback + text)
            past = hidden[-1]
            code0 = self._choose(self.codec_head(hidden), s.talker_banned, "talker")
            self.timing.talker_step.append(time.perf_counter() - t_talker)
            self.timing.per_frame.append(time.perf_counter() - t)
            self.timing.per_frame_cpu.append(time.process_time() - cpu)
            if on_frame is not None:
                pcm = on_frame(np.asarray([frame], np.int32))
                if pcm.size and self.timing.first_audio is None:
                    self.timing.first_audio = time.perf_counter() - t0
        return {"xvector": xvec, "prompt": prompt, "trailing": trailing,
                "codes": np.asarray(codes, np.int32)}

    # ------------------------------------------------------------------ codec
    def _codec_feeds(self, codes: np.ndarray, start: int) -> dict[str, Any]:
        return codec_feeds(self.pipe.codec_front.extra, self.codec.part, self.codec_fusion,
                           codes, start)

    def decode_offline(self, codes: np.ndarray) -> np.ndarray:
        t = time.perf_counter()
        wav = self.codec.run(self._codec_feeds(codes, 0)).reshape(-1)
        self.timing.codec_offline = time.perf_counter() - t
        return wav

    def decode_chunked(self, codes: np.ndarray, chunks: Sequence[int]) -> np.ndarray:
        """Frames arrive `chunks` at a time: the codec front runs on the new frames plus its
        left context (work grows with the context up to `front_context`), the conv stack
        streams with its state; returns the concatenation. For a codec whose RoPE positions
        are in-graph (the raw export: every call starts at 0), where a window cache cannot
        continue a stream; `decode_streaming` is the constant-cost path."""
        from paramsurgery.streaming import StreamingRunner

        st = self.pipe.codec_stream
        runner = StreamingRunner(st["param"], st["bin"], st["manifest"],
                                 start_param=st["start_param"], options=self.options)
        ctx = int(self.pipe.codec_front.extra["context"])
        cut = self.pipe.codec_cut
        pieces = []
        pos = 0
        sizes = list(chunks)
        while pos < codes.shape[0]:
            n = min(sizes[len(pieces) % len(sizes)], codes.shape[0] - pos)
            t = time.perf_counter()
            start = max(0, pos - ctx)
            hidden = self.front.run(self._codec_feeds(codes[start:pos + n], start), output=cut)
            hidden = hidden.reshape(pos + n - start, -1)[pos - start:]
            pieces.append(runner.push(hidden).reshape(-1))
            self.timing.codec_chunks.append(time.perf_counter() - t)
            pos += n
        pieces.append(runner.flush().reshape(-1))
        return np.concatenate(pieces)

    def stream_decoder(self) -> Any:
        """A `codec_stream.StreamingCodec` over the assembled pipeline: constant work per
        chunk (window cache + conv states), fed through this generator's codec feeds."""
        from .codec_stream import StreamingCodec

        front = self.pipe.codec_front.extra
        roles = {i["name"]: i["blob"] for i in self.codec.part.io["inputs"]
                 if i["name"] in ("mask", "cos", "sin")}
        return StreamingCodec(self.pipe.codec_parts, self.pipe.codec_stream, self.options,
                              self._codec_feeds, roles, int(front["head_dim"]),
                              float(front["rope_theta"]))

    def decode_streaming(self, codes: np.ndarray, chunks: Sequence[int]) -> np.ndarray:
        """Frames arrive `chunks` at a time (cycled) through the constant-cost stream; returns
        the concatenated PCM. Per-chunk times go to `timing.codec_stream_chunks`. Without a
        stream (`pipe.codec_parts` None: the raw codec) the front-recompute `decode_chunked`."""
        if self.pipe.codec_parts is None:
            wav = self.decode_chunked(codes, chunks)
            self.timing.codec_stream_chunks = list(self.timing.codec_chunks)
            return wav
        codec = self.stream_decoder()
        pieces = []
        pos = 0
        sizes = list(chunks)
        while pos < codes.shape[0]:
            n = min(sizes[len(pieces) % len(sizes)], codes.shape[0] - pos)
            pieces.append(codec.push(codes[pos:pos + n]))
            pos += n
        pieces.append(codec.flush())
        self.timing.codec_stream_chunks = list(codec.timings)
        return np.concatenate(pieces)
