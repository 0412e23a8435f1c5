"""`paramsurgery reduce`: shrink a failing ncnn graph to a minimal one that still fails.

The idea is Polygraphy's `debug reduce` (bisect, then linear), on ncnn graphs:

1. **outputs side**: find the shortest prefix (layers in file order, which is topological)
   that still fails; a prefix needs no new inputs. Then keep only the cone of its last layer
   (that layer and its ancestors) if the cone still fails.
2. **inputs side**: drop layers from the front of the cone. A blob a kept layer reads whose
   producer was dropped becomes the top of a new `Input` layer (named `cut_<blob>`, with
   the blob's shape as Input params when known), fed with the value the blob had in a full
   run (see below). Bisect gallops from the failing end: 1, 2, 4, ... layers, then halves.
3. **linear**: try removing every remaining layer one at a time until no single removal
   keeps the failure (1-minimal).

`mode="linear"` replaces the halving of phases 1 and 2 by one layer at a time (slower,
robust when the failure is not monotone). Weights stay exact: a candidate is the source
graph minus layers, and every kept layer's weight blobs are copied byte for byte from the
source `.bin` (paramsurgery.formats.weights); the result is checked against the source afterwards.

What "fails" means is a check:
- `CommandCheck`: a shell-free command template, `{param}` `{bin}` `{inputs}` `{expected}`
  `{dir}` substituted; it fails when its exit code is non-zero (or one of `fail_codes`,
  negative = killed by that signal) and, if given, its output matches `fail_regex`;
- `PredicateCheck`: a Python function `fn(candidate) -> bool` (True = still fails);
- `BuiltinCheck`: the graph run through ncnn in a child process; kind `crash` (killed by
  the same signal as the original), `load-error` (load_param/load_model fails), `mismatch`
  (an output differs from the same blob of a reference graph) or `any`.

Values for cut inputs: the graph's own inputs come from `--inputs` (npz: blob name ->
array, `batch_index_<blob>` optional, the repro fixtures' ref.npz works as is); every
other blob's value is harvested once by running the reference graph (mismatch) or the
source graph itself in a child process that extracts every blob in file order and saves
each one as it goes, so a crash keeps everything computed before it (and tells which
layer crashed, a head start for phase 1).

The replay log (replay.json) records every candidate tried (kept layers, verdict, detail,
seconds) keyed by the sha256 of its .param; `replay=` reuses recorded verdicts.
"""

from paramsurgery.repro.reduce.algorithm import (ReduceOutput, ReduceResult, Reducer, SourcePasses, Step,
                                                 reduce_graph)
from paramsurgery.repro.reduce.builder import Builder, Candidate, Verdict
from paramsurgery.repro.reduce.checks import (BuiltinCheck, Check, CommandCheck, PredicateCheck,
                                              compare_values, load_predicate)
from paramsurgery.repro.reduce.values import FAIL, KINDS, OTHER, PASS, UNKNOWN, Harvest, ValueStore, harvest

__all__ = ["BuiltinCheck", "Builder", "Candidate", "Check", "CommandCheck", "FAIL", "Harvest",
           "KINDS", "OTHER", "PASS", "PredicateCheck", "ReduceOutput", "ReduceResult",
           "Reducer", "SourcePasses", "Step", "UNKNOWN", "ValueStore", "Verdict",
           "compare_values", "harvest", "load_predicate", "reduce_graph"]
