"""The report rows of a graph before anything is compared: one per blob, in graph order,
named after its producer (file line, type), and each layer's bottoms for the
first-divergence walk."""

from __future__ import annotations

from paramsurgery.ir.graph import Graph
from paramsurgery.verify.compare.ncnn_run import cache_tops
from paramsurgery.verify.compare.report import SKIPPED, BlobRow, Report


def blank_report(graph: Graph, target: str, reference: str, mode: str, atol: float,
                 rtol: float) -> tuple[Report, dict[str, BlobRow]]:
    report = Report(target, reference, mode, atol, rtol)
    opaque = cache_tops(graph)
    by_blob: dict[str, BlobRow] = {}
    for layer in graph:
        report.layer_inputs[layer.name] = layer.inputs
        for b in layer.outputs:
            row = BlobRow(b, layer.name, layer.type, layer.source_line)
            if b in opaque:
                row.status, row.note = SKIPPED, "opaque kv-cache buffer"
            report.rows.append(row)
            by_blob.setdefault(b, row)
    return report, by_blob
