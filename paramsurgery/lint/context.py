"""What every lint rule sees: the graph, the optional inputs (weights, pnnx's IR, a reference
run, input shapes) and analyses computed once and shared (positions, the structural
findings of `validate`, the conformance runs), so no rule rescans the graph per layer."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

from paramsurgery.core.findings import Finding

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import PnnxGraph
    from paramsurgery.analysis.shapes import ShapeMap
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer
    from paramsurgery.lint.conformance import Conformance
    from paramsurgery.formats.pnnx_reference import InputSpec, Reference


@dataclass
class LintOptions:
    """Knobs of a lint run.

    `run`: run the graph through ncnn for the PS4xx conformance rules: True, False, or None
    (= when pnnx's IR or a reference is available and ncnn is importable).
    `max_synth_bytes`: largest synthetic `.bin` made for a run when no weights are given
    (bigger graphs skip the run with an info finding).
    `timeout`: seconds per ncnn child process."""

    run: bool | None = None
    max_synth_bytes: int = 256 << 20
    timeout: float = 120.0
    depth_limit: int = 30000
    blob_limit: int = 20000


class LintContext:
    def __init__(self, graph: "Graph", *, path: str | None = None, bin: str | None = None,
                 pnnx: "PnnxGraph | None" = None, reference: "Reference | None" = None,
                 input_shapes: "Sequence[InputSpec] | None" = None,
                 run_bin: str | None = None, options: LintOptions | None = None) -> None:
        self.graph = graph
        self.path = path if path is not None else graph.source.path
        self.bin = os.fspath(bin) if bin is not None else None
        self.run_bin = run_bin  # weights to run with (the .bin next to the file), not linted
        self.pnnx = pnnx
        self.reference = reference
        self.input_shapes = list(input_shapes) if input_shapes else None
        self.options = options or LintOptions()
        self.inputshape: dict = {}  # blob -> numpy-order shape (--inputshape)
        self.extra: dict[str, Any] = {}

    # ------------------------------------------------------------------ graph views
    @cached_property
    def layers(self) -> list["Layer"]:
        return self.graph.layers

    @cached_property
    def index(self) -> dict[int, int]:
        """Layer id → position in file order."""
        return {layer.id: i for i, layer in enumerate(self.layers)}

    @cached_property
    def layers_by_params(self) -> list[list["Layer"]]:
        """Layers grouped by type and unedited param text (first appearance order): what a
        rule concludes from one layer's params holds for its whole group, so per-param rules
        parse each distinct line once instead of every layer's."""
        return _group_by_params(self.layers)

    def param_groups(self, *types: str) -> list[list["Layer"]]:
        """`layers_by_params` restricted to some layer types (read through the type index,
        so a rule about Gemm does not visit the other layers)."""
        return _group_by_params(self.graph.by_type(*types))

    def producer(self, blob: str) -> "Layer | None":
        return self.graph.producer(blob)

    def consumer_layers(self, blob: str) -> list["Layer"]:
        return self.graph.consumer_layers(blob)

    def through_splits(self, blob: str) -> list["Layer"]:
        """The layers reading `blob`, looking through `Split` copies."""
        from paramsurgery.patterns.match import through_splits

        return through_splits(self.graph, blob)

    def source_of(self, blob: str) -> "Layer | None":
        """The producer of `blob`, looking back through `Split` copies."""
        from paramsurgery.patterns.match import source_of

        return source_of(self.graph, blob)

    # ------------------------------------------------------------------ shared analyses
    @cached_property
    def shapes(self) -> "ShapeMap":
        """Every blob's static shape (paramsurgery.analysis.shapes), computed once per lint, from
        `--inputshape` when given, else the Input layers and the file's hints."""
        from paramsurgery.analysis.shapes import infer_shapes

        return infer_shapes(self.graph, self.inputshape or None)

    @cached_property
    def validate_findings(self) -> list[Finding]:
        from paramsurgery.analysis.validate import validate

        return validate(self.graph)  # cached on the graph: free after the caller's validate

    @cached_property
    def conformance(self) -> "Conformance":
        from paramsurgery.lint.conformance import Conformance

        return Conformance(self)

    @property
    def can_run(self) -> bool:
        return self.options.run is not False


def _group_by_params(layers: Sequence["Layer"]) -> list[list["Layer"]]:
    groups: dict[tuple[str, str], list["Layer"]] = {}
    out: list[list["Layer"]] = []
    for layer in layers:
        text = layer.params.source_text()
        if text is None:  # edited: its own group
            out.append([layer])
            continue
        key = (layer.type, text)
        group = groups.get(key)
        if group is None:
            group = groups[key] = []
            out.append(group)
        group.append(layer)
    return out
