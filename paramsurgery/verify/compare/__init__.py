"""`paramsurgery compare`: which layer first goes wrong - an ncnn graph against another
ncnn graph (`against_ncnn`) or against pnnx's own torch export (`against_torch`).

One concept per module: `frames` (the blob stream), `ncnn_child` / `ncnn_run` (streamed
ncnn runs in a child), `torch_child` / `torch_run` (pnnx's `X_pnnx.py` with every operand
captured), `inputs` (feeds), `layout` (lining two arrays up, errors), `graph_match`
(ncnn ↔ ncnn blobs), `mapping` (ncnn blob ↔ pnnx operand, also used by lint), `report`.
"""

from __future__ import annotations

from paramsurgery.verify.compare.against_ncnn import compare_ncnn
from paramsurgery.verify.compare.ncnn_run import NcnnSide
from paramsurgery.verify.compare.report import BlobRow, Report

__all__ = ["BlobRow", "NcnnSide", "Report", "compare_ncnn"]
