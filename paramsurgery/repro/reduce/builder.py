"""Candidates: the source graph minus layers, cut blobs turned into `Input`s fed with
their harvested values, weights copied byte for byte."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from paramsurgery.ir.graph import Graph
from paramsurgery.passes.extract import inputs_for_cut
from paramsurgery.runtime.child import Feed

from paramsurgery.repro.reduce.values import FAIL, ValueStore
from paramsurgery.formats.io import save
from paramsurgery.formats.param_text import dump_bytes


# =========================================================================== candidates

@dataclass
class Candidate:
    """One graph tried during the reduction. Files live in a scratch directory until the
    next candidate is built: copy what you need inside a predicate."""

    keep: tuple[int, ...]             # kept layer positions (non-Input layers of the source)
    graph: Graph
    param: Path
    bin: Path | None
    inputs: list[str]                 # the candidate's graph inputs (Input tops)
    outputs: list[str]                # blobs nobody reads (what ncnn can extract)
    cut: list[str]                    # inputs that are cut blobs (new Input layers)
    feeds: dict[str, Feed]            # known values of `inputs`
    missing: list[str]                # inputs without a known value
    expected: dict[str, np.ndarray]   # reference values of `outputs`, when known
    reference: "ValueStore | None"    # reference values of every blob (mismatch checks)
    inputs_npz: Path
    expected_npz: Path
    key: str                          # sha256 of the .param text

    @property
    def layers(self) -> int:
        """Layers other than Input."""
        return len(self.keep)

    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.graph if layer.type != "Input"]


@dataclass
class Verdict:
    result: str                       # fail | pass | other | unknown
    detail: str = ""
    signal: int | None = None         # the signal that killed ncnn, for crashes

    @property
    def failed(self) -> bool:
        return self.result == FAIL


@dataclass(eq=False)  # a builder is a place to work in, compared by identity
class Builder:
    """Makes candidate graphs out of a source graph (weights attached or not)."""

    graph: Graph
    values: ValueStore
    expected: ValueStore | None
    workdir: Path
    has_bin: bool

    def __post_init__(self) -> None:
        self.layers = list(self.graph)
        self.universe = [i for i, layer in enumerate(self.layers) if layer.type != "Input"]
        self.pos = {layer.id: i for i, layer in enumerate(self.layers)}
        self._n = 0

    def producer_pos(self, blob: str) -> int | None:
        p = self.graph.producer(blob)
        return None if p is None else self.pos[p.id]

    def cone(self, sink: int, within: Iterable[int]) -> list[int]:
        """`sink` and its ancestors among `within` (Input layers excluded), in file order:
        the shared cut (`paramsurgery.ir.cone`) restricted to those layers."""
        from paramsurgery.ir.cone import cone

        allowed = {self.layers[i].id for i in within if self.layers[i].type != "Input"}
        return sorted(self.pos[i] for i in cone(self.graph, [self.layers[sink].id],
                                                within=allowed))

    def subgraph(self, keep: Iterable[int]) -> tuple[Graph, list[str]]:
        """The source graph with only `keep` (positions of non-Input layers); returns the
        graph and the cut blobs that became new Inputs."""
        keep_set = set(keep)
        g = self.graph.copy()
        copies = list(g)
        for i, layer in enumerate(copies):
            if layer.type != "Input" and i not in keep_set:
                g.remove_layer(layer)
        for layer in g.by_type("Input"):
            if not any(g.consumers(b) for b in layer.outputs):
                g.remove_layer(layer)
        cut: list[str] = []
        for layer in g:
            for b in layer.inputs:
                if g.producer(b) is None and b not in cut and \
                        self.graph.producer(b) is not None:
                    cut.append(b)
        inputs_for_cut(g, cut, name=lambda b: f"cut_{b}", params=self.values.input_params)
        g.mark_modified()
        return g, cut

    def build(self, keep: Iterable[int]) -> Candidate:
        keep_t = tuple(sorted(set(keep)))
        g, cut = self.subgraph(keep_t)
        self._n += 1
        d = self.workdir / "candidate"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        param = d / "model.param"
        binp = d / "model.bin" if self.has_bin else None
        data = dump_bytes(g)
        if binp is not None:
            save(g, param, binp)
        else:
            param.write_bytes(data)
        inputs = g.inputs
        outputs = g.outputs
        feeds: dict[str, Feed] = {}
        missing = []
        for b in inputs:
            f = self.values.feed(b)
            if f is None:
                missing.append(b)
            else:
                feeds[b] = f
        expected: dict[str, np.ndarray] = {}
        exp_store = self.expected
        if exp_store is not None:
            for b in outputs:
                v = exp_store.get(b)
                if v is not None:
                    expected[b] = v[0]
        self.values.save_npz(d / "inputs.npz", inputs)
        if exp_store is not None:
            exp_store.save_npz(d / "expected.npz", outputs)
        else:
            np.savez(d / "expected.npz")
        return Candidate(keep_t, g, param, binp, inputs, outputs, cut, feeds, missing,
                         expected, exp_store, d / "inputs.npz", d / "expected.npz",
                         hashlib.sha256(data).hexdigest())
