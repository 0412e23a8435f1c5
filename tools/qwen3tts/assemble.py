"""Assemble the ncnn Qwen3-TTS pipeline from the fixture graphs with paramsurgery's passes
(no torch): what a user of the tool does to a fresh pnnx export.

| pipeline part | fixture graph | passes |
|---|---|---|
| talker | talker_decoder | fold-gqa (native GQA), add-kvcache |
| code predictor | predictor_decoder | fold-gqa, add-kvcache |
| frame feedback sum | predictor_embeds.unfused (15 Embeds + adds) | fuse-codebooks (one table, sum in-graph) |
| predictor step rows | predictor_embeds.ported (the port's fused table) | -- |
| codec decoder | codec_decoder.ported_levelsum_per_level (15 acoustic Embeds) | fuse-codebooks, then extract: front + conv stack (add-conv-cache); the front cut again for streaming (codec_stream.py) |
| text / codec embeds, heads, speaker | `ported` nets as exported | -- |

`variant="raw"`: every module that has a raw export is first run through `paramsurgery
fix X --bin X.bin -o Y` alone, as a user would (the codec decoder's static export included:
fix dynamizes it from its one trace and the reference next to it), and must load in ncnn; the raw graphs keep
their own I/O conventions (the manifest `io` and reference shapes say how to feed them). A
module that has no raw export or that ncnn still cannot load stops the assembly with
`RawNotReady` naming it, or with `raw_fallback` keeps its ported graph. The predictor's
single-group rows always come from the port's fused table (no raw net computes them).

Passes that leave the weights alone (fold-gqa, add-kvcache) write only a `.param` and reuse
the source `.bin`; passes that change weights (fuse-codebooks, extract, add-conv-cache)
write their own `.bin`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paramsurgery import load
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.conv1d_as_2d import Conv1dAs2d
from paramsurgery.passes.extract import extract_subgraph
from paramsurgery.passes.fold_gqa import FoldGQA
from paramsurgery.passes.fuse_codebooks import FuseCodebooks
from paramsurgery.formats.codebooks import FusedManifest
from paramsurgery.passes.kvcache import AddKVCache, cache_slots
from paramsurgery.runtime.child import run_isolated
from paramsurgery.formats.io import save

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"

# pipeline part -> (module, ported-variant graph it starts from)
SOURCES: dict[str, tuple[str, str]] = {
    "text_embed": ("talker_text_embed", "ported"),
    "codec_embed": ("talker_codec_embed", "ported"),
    "talker": ("talker_decoder", "ported"),
    "codec_head": ("talker_codec_head", "ported"),
    "predictor": ("predictor_decoder", "ported"),
    "predictor_rows": ("predictor_embeds", "ported"),
    "feedback_sum": ("predictor_embeds", "unfused"),
    "predictor_heads": ("predictor_heads", "ported"),
    "speaker": ("speaker_encoder", "ported"),
    "codec": ("codec_decoder", "ported_levelsum_per_level"),
}
# parts whose module has a raw export that replaces the ported graph in the raw variant
RAW_PARTS = ("text_embed", "codec_embed", "talker", "codec_head", "predictor", "feedback_sum",
             "predictor_heads", "speaker", "codec")


class RawNotReady(RuntimeError):
    """The raw variant cannot be assembled: `module` has no raw export or `fix` leaves it
    unloadable."""

    def __init__(self, module: str, reason: str) -> None:
        super().__init__(f"{module}: {reason}")
        self.module = module
        self.reason = reason


@dataclass
class Part:
    """One assembled net: files, the manifest `io` of the module it came from (pnnx blob
    names and batch axes) and the reference input shapes (their ranks)."""

    name: str
    module: str
    variant: str
    param: Path
    bin: Path | None
    io: dict[str, Any]
    ref_shapes: list[list[int]]
    extra: dict[str, Any] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)


@dataclass
class Pipeline:
    size: str
    variant: str
    parts: dict[str, Part]
    codec_cut: str                    # blob where the codec's conv stack starts
    codec_front: Part
    codec_stream: dict[str, Any]      # streaming.convert(...) result fields
    log: list[str] = field(default_factory=list)
    codec_parts: Any = None           # codec_stream.CodecParts: the constant-cost stream


def export_record(manifest: dict[str, Any], module: str, variant: str, size: str) -> dict:
    for rec in manifest["qwen3_tts"]["exports"]:
        if (rec["module"], rec["variant"], rec["size"]) == (module, variant, size):
            return rec
    raise KeyError(f"{module}.{variant} ({size}) is not in fixtures/manifest.json")


def _fixture(rec: dict[str, Any], kind: str) -> Path | None:
    rel = rec.get("files", {}).get(kind)
    return FIXTURES / rel if rel else None


def _save(g: Graph, work: Path, stem: str, with_bin: bool) -> tuple[Path, Path | None]:
    param = work / f"{stem}.param"
    if with_bin:
        binp = work / f"{stem}.bin"
        save(g, param, bin=binp)
        return param, binp
    save(g, param)
    return param, None


def _decoder_with_cache(g: Graph, log: list[str]) -> Graph:
    try:
        res = FoldGQA()(g)
        log.append(f"fold-gqa: {len(res.changes)} change(s)" if res.modified
                   else "fold-gqa: " + "; ".join(res.notes or ["nothing to fold"]))
        g = res.graph
    except PassRefused as exc:
        log.append(f"fold-gqa: refused: {exc}")
    res = AddKVCache()(g)
    log.append(f"add-kvcache: {len(cache_slots(res.graph))} SDPA layer(s) with a native cache")
    return res.graph


def codec_cut_blob(g: Graph) -> str:
    """The blob the codec's conv stack starts from: what the first Deconvolution1D reads,
    followed back through layout-only layers (Permute/Reshape) to the transformer's output
    projection, (T, C) frames."""
    deconvs = g.by_type("Deconvolution1D")
    if not deconvs:
        raise ValueError("the codec decoder has no Deconvolution1D (no conv upsampler)")
    blob = deconvs[0].inputs[0]
    producer = g.producer(blob)
    while producer is not None and producer.type in ("Permute", "Reshape") \
            and len(producer.inputs) == 1:
        blob = producer.inputs[0]
        producer = g.producer(blob)
    return blob


def front_context(front: Graph, window: int) -> int:
    """Frames of left context after which the codec front (causal convs + sliding-window
    attention) no longer depends on earlier frames: sum of (K-1)*dilation over its
    Convolution1D layers plus (window-1) per attention layer."""
    ctx = 0
    for conv in front.by_type("Convolution1D"):
        k, d = int(conv.params.get(1, 1)), int(conv.params.get(2, 1))
        ctx += (k - 1) * d
    return ctx + len(front.by_type("SDPA")) * (window - 1)


def _left_types(fix_output: str, g: Graph) -> str:
    """What keeps a graph from loading, briefly: the non-ncnn layer types left, counted."""
    from paramsurgery.core.layer_types import is_ncnn_layer

    counts: dict[str, int] = {}
    for layer in g:
        if not is_ncnn_layer(layer.type):
            counts[layer.type] = counts.get(layer.type, 0) + 1
    if not counts:
        return fix_output.strip().splitlines()[-1] if fix_output.strip() else "?"
    return ", ".join(f"{t} x{n}" for t, n in sorted(counts.items()))


def _fix_raw(module: str, rec: dict[str, Any], work: Path) -> tuple[Path, Path | None]:
    """`paramsurgery fix X.ncnn.param --bin X.ncnn.bin -o Y.param` on a raw export (the
    codec decoder's static one: pnnx aborts re-tracing it), then an ncnn load check in a
    child process."""
    from qwen3tts.rawfix import left_types, raw_variant, run_fix

    if raw_variant(module) != "raw":
        rec = export_record(load_manifest(), module, raw_variant(module), rec["size"])
    param, binp = _fixture(rec, "ncnn_param"), _fixture(rec, "ncnn_bin")
    if param is None:
        status = rec.get("status", {})
        code = status.get("returncode")
        raise RawNotReady(module, f"no raw export in the fixtures (pnnx: {status.get('kind')}"
                                  + (f", exit {code})" if code is not None else ")"))
    out = work / f"{module}.raw.fixed.param"
    code, text = run_fix(param, binp, out, always_write=True)
    if not out.exists():
        tail = text.strip().splitlines()[-3:]
        raise RawNotReady(module, f"paramsurgery fix wrote nothing (exit {code}): "
                                  + " | ".join(tail))
    out_bin = out.with_suffix(".bin") if binp is not None else None
    check = run_isolated(out, out_bin, {}, [])
    if check.status != "ok":
        raise RawNotReady(module, f"ncnn cannot load it after paramsurgery fix (exit {code}; "
                                  f"{check.describe()}); left: {left_types(out)}")
    bound = re.search(r"exact for lengths up to (\d+) \(", text)
    if bound:
        FIX_BOUNDS[module] = int(bound.group(1))
    return out, out_bin


# module -> the longest length its `fix` output is exact for (one-trace position tables)
FIX_BOUNDS: dict[str, int] = {}


@functools.cache
def load_manifest() -> dict[str, Any]:
    return json.loads((FIXTURES / "manifest.json").read_text())


def fix_raw_modules(size: str, manifest: dict[str, Any], work: Path
                    ) -> tuple[dict[str, tuple[Path, Path | None]], list[RawNotReady]]:
    """`fix` (+ fold-gqa) on every raw module the pipeline uses: the ones ncnn loads
    afterwards, and a RawNotReady per module that has no raw export or still does not load."""
    fixed: dict[str, tuple[Path, Path | None]] = {}
    failures: list[RawNotReady] = []
    FIX_BOUNDS.clear()
    for module in dict.fromkeys(SOURCES[part][0] for part in RAW_PARTS):
        try:
            fixed[module] = _fix_raw(module, export_record(manifest, module, "raw", size), work)
        except KeyError:
            failures.append(RawNotReady(module, "no raw record in fixtures/manifest.json"))
        except RawNotReady as exc:
            failures.append(exc)
    return fixed, failures


def _fuse(part: str, g: Graph, work: Path, extra: dict[str, Any], log: list[str]
          ) -> tuple[Path, Path | None, Graph]:
    try:
        res = FuseCodebooks()(g)
    except PassRefused as exc:
        log.append(f"fuse-codebooks: refused: {exc}")
        extra["fusion"] = None
        param, binp = _save(g, work, f"{part}.unfused", with_bin=True)
        return param, binp, g
    fm: FusedManifest = res.data["manifest"]
    log.append(f"fuse-codebooks: {len(fm.fusions)} fusion(s), "
               + ", ".join(f"{len(f.groups)} tables -> {f.embed} ({f.input_dim} rows)"
                           for f in fm.fusions))
    extra["fusion"] = fm.fusions[0]
    param, binp = _save(res.graph, work, f"{part}.fused", with_bin=True)
    return param, binp, res.graph


def convs_as_2d(params: list[Path]) -> str:
    """`conv1d-as-2d` on each codec graph, `.param` rewritten in place: the pass leaves the
    weights' bytes as they are (1-D and 2-D layouts agree), so each graph keeps its `.bin`
    (the stream's start graph shares its steady graph's)."""
    counts = []
    for param in params:
        res = Conv1dAs2d()(load(param))
        if res.modified:
            save(res.graph, param)
        counts.append(f"{param.stem} {len(res.changes)}")
    return "codec: conv1d-as-2d (ncnn's 2-D conv kernels): " + ", ".join(counts) + " conv(s)"


def assemble(size: str, variant: str, work: Path, bins: dict[str, Path] | None = None,
             manifest: dict[str, Any] | None = None, raw_fallback: bool = False,
             conv2d: bool = True) -> Pipeline:
    """Build every net of the pipeline into `work`. `bins` overrides the weights of source
    graphs by module.variant (real size: synth-bin files). `variant="raw"` uses the raw
    exports after `fix`; a module that cannot run raw raises RawNotReady unless
    `raw_fallback`, which keeps its ported graph (and says so in the log). `conv2d`: the
    codec's 1-D convolutions as ncnn's 2-D ops afterwards (`conv1d-as-2d`: ncnn's 1-D x86
    kernels are 2-13x slower on the real codec, tools/qwen3tts/profile_codec.py)."""
    from paramsurgery.streaming import convert

    manifest = manifest or json.loads((FIXTURES / "manifest.json").read_text())
    bins = bins or {}
    parts: dict[str, Part] = {}
    log: list[str] = []
    fixed: dict[str, tuple[Path, Path | None]] = {}
    if variant == "raw":
        fixed, failures = fix_raw_modules(size, manifest, work)
        if failures and not raw_fallback:
            raise RawNotReady(", ".join(f.module for f in failures),
                              "\n" + "\n".join(f"  {f.module}: {f.reason}" for f in failures))
        log += [f"{f.module}: ported graph kept (raw: {f.reason})" for f in failures]
    codec_graph = None
    for part, (module, var) in SOURCES.items():
        if part in RAW_PARTS and module in fixed:
            var = "raw"
        rec = export_record(manifest, module, var, size)
        if var == "raw" and "io" not in rec:      # the codec: its static raw export's I/O
            rec = export_record(manifest, module, "raw_static", size)
        if var == "raw":
            src_param, src_bin = fixed[module]
        else:
            src_param = _fixture(rec, "ncnn_param")
            src_bin = bins.get(f"{module}.{var}") or _fixture(rec, "ncnn_bin")
        how = ("static export, paramsurgery fix (fix-slice + dynamize from one trace)"
               if "raw_static" in rec["variant"] else "paramsurgery fix")
        item_log: list[str] = [f"{how}: loads in ncnn"] if var == "raw" else []
        if var == "raw" and module in FIX_BOUNDS:
            item_log.append(f"exact for lengths up to {FIX_BOUNDS[module]} (one-trace "
                            f"position tables)")
        extra: dict[str, Any] = {}
        if part in ("talker", "predictor"):
            g = _decoder_with_cache(load(src_param), item_log)
            param, _ = _save(g, work, f"{part}.kv", with_bin=False)
            binp = src_bin
            extra["slots"] = [[s.k_in, s.v_in, s.k_out, s.v_out] for s in cache_slots(g)]
            extra["convention"] = rec.get("notes", {}).get("convention", {})
        elif part == "codec" or (part == "feedback_sum" and var != "raw"):
            param, binp, g = _fuse(part, load(src_param, bin=src_bin), work, extra, item_log)
            if part == "codec":
                codec_graph = g
        else:
            param, binp = src_param, src_bin
        if part == "predictor_rows":
            extra["vocab"] = rec["notes"]["vocab"]
        parts[part] = Part(part, module, var, param, binp, rec["io"],
                           rec["input_shapes"]["reference"], extra, item_log)
        log += [f"{part} ({module}.{var}): {line}" for line in item_log]

    assert codec_graph is not None
    codec = parts["codec"]
    cut = codec_cut_blob(codec_graph)
    front = extract_subgraph(codec_graph, None, [cut])
    conv = extract_subgraph(codec_graph, [cut], list(codec_graph.outputs))
    fp, fb = _save(front, work, "codec_front", with_bin=True)
    cp, cb = _save(conv, work, "codec_conv", with_bin=True)
    stream = convert(cp, cb, str(work / "codec_conv.stream"))
    notes = export_record(manifest, "codec_decoder", "ported", size)["notes"]
    win = int(notes["sliding_window"])
    front_part = Part("codec_front", codec.module, codec.variant, fp, fb, codec.io,
                      codec.ref_shapes, {"context": front_context(front, win), "window": win,
                                         "rope_theta": notes["rope_theta"],
                                         "head_dim": notes["head_dim"]})
    states = stream.manifest["states"]
    log.append(f"codec: extract front -> {cut} ({len(front)} layers), conv stack "
               f"{cut} -> {', '.join(conv.outputs)} ({len(conv)} layers); add-conv-cache: "
               f"{len(states)} state blob(s); front context {front_part.extra['context']} frames")
    from qwen3tts import codec_stream

    names = {i["name"] for i in codec.io["inputs"]}
    codec_parts = None
    if {"mask", "cos", "sin"} <= names:
        codec_parts = codec_stream.build(front, win, work, _save)
        log += codec_parts.log
    else:       # the raw export: RoPE positions in-graph, from 0 at every call
        log.append(f"codec stream: not built ({codec.module}.{codec.variant} has no cos/sin "
                   f"inputs: its positions restart at every call, so cached keys could not be "
                   f"continued); chunks recompute the front over its left context")
    if conv2d:
        conv_params = [codec.param, Path(stream.param)] + \
            ([Path(stream.start_param)] if stream.start_param else [])
        if codec_parts is not None:
            conv_params += [Path(codec_parts.conv["param"])] + \
                ([Path(codec_parts.conv["start_param"])] if codec_parts.conv["start_param"]
                 else [])
        log.append(convs_as_2d(conv_params))
    return Pipeline(size, variant, parts, cut, front_part,
                    {"param": stream.param, "bin": stream.bin, "manifest": stream.manifest_path,
                     "start_param": stream.start_param}, log, codec_parts)
