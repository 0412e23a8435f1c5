"""What `paramsurgery info` reports about a graph, as plain data."""

from __future__ import annotations

from typing import Any

from paramsurgery.core.text import count
from paramsurgery.ir.graph import Graph
from paramsurgery.core.layer_types import is_converter_leftover, is_ncnn_layer


def summarize(g: Graph) -> dict[str, Any]:
    src = g.source
    hist = sorted(g.types().items(), key=lambda kv: (-kv[1], kv[0]))
    foreign = [{"type": layer.type, "name": layer.name, "line": layer.source_line,
                "converter_leftover": is_converter_leftover(layer.type)}
               for layer in g if not is_ncnn_layer(layer.type)]
    return {
        "file": src.path,
        "format": src.format,
        "layers": len(g),
        "blobs": g.blob_count(),
        "header": {"layers": src.declared_layers, "blobs": src.declared_blobs},
        "inputs": g.inputs,
        "outputs": g.outputs,
        "layer_types": dict(hist),
        "not_ncnn_layers": foreign,
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = []
    hdr = s["header"]
    head = (f"{s['file'] or '<graph>'}: {s['format']}, {count(s['layers'], 'layer')}, "
            f"{count(s['blobs'], 'blob')}")
    if hdr["layers"] is not None and (hdr["layers"], hdr["blobs"]) != (s["layers"], s["blobs"]):
        head += f" (header says {count(hdr['layers'], 'layer')}, {count(hdr['blobs'], 'blob')})"
    lines.append(head)
    lines.append("inputs:  " + (" ".join(s["inputs"]) or "(none)"))
    lines.append("outputs: " + (" ".join(s["outputs"]) or "(none)"))
    lines.append("layer types: " + ", ".join(f"{t} {n}" for t, n in s["layer_types"].items()))
    if s["not_ncnn_layers"]:
        lines.append(f"not ncnn layers ({len(s['not_ncnn_layers'])}, ncnn cannot load them):")
        for x in s["not_ncnn_layers"]:
            kind = "converter leftover" if x["converter_leftover"] else "custom/unknown"
            lines.append(f"  line {x['line']}: {x['type']} {x['name']} ({kind})")
    else:
        lines.append("not ncnn layers: none")
    if "weights" in s:
        w = s["weights"]
        lines.append(f"weights: {w['total_bytes']} bytes in {w['file']}")
        for t, b in w["by_type"].items():
            lines.append(f"  {t}: {b} bytes")
        for d, b in w["by_dtype"].items():
            lines.append(f"  {d}: {b} bytes")
    return "\n".join(lines)
