"""Running passes in order: a pass that refuses or breaks its postcondition is rolled back
and reported, the graph before it kept (`paramsurgery fix` and the Python API)."""

from __future__ import annotations

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import Pass, PassResult, resolved


class PassManager:
    """Run passes in order. A pass that refuses or breaks its postcondition is rolled back
    (its result is discarded, the previous graph is kept) and, with `early_stop`, the
    remaining passes are not run."""

    def __init__(self, passes: list[Pass], *, early_stop: bool = True) -> None:
        self.passes = passes
        self.early_stop = early_stop
        self.refusals: list[PassRefused] = []  # the refusals of the last run, located

    def run(self, g: Graph) -> tuple[Graph, list[PassResult], list[tuple[str, str]]]:
        results: list[PassResult] = []
        failures: list[tuple[str, str]] = []
        self.refusals = []
        current = g
        for p in self.passes:
            try:  # an input given as `Deferred` is read now, after the passes before it
                res = resolved(p)(current)
            except PassRefused as exc:
                failures.append((p.name, exc.message))
                self.refusals.append(exc)
                if self.early_stop:
                    break
                continue
            results.append(res)
            current = res.graph
        return current, results, failures
