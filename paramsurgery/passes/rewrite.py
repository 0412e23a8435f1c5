"""`rewrite`: user-written rules (a pattern and its replacement in the `.param` format,
`patterns/rule_file.py`) applied to a graph. Each rule's matches are found in one scan and
rewritten (non-overlapping); rounds repeat while a round changed something, at most
`max_rounds` times. The command (`commands/rewrite.py`) proves the result through ncnn."""

from __future__ import annotations

from typing import Any, Sequence

from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.core.match import Explain, MatchFailure
from paramsurgery.formats.weights.schema import reads_for
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.patterns.match import readers_through_splits
from paramsurgery.patterns.pattern import Binding, find_matches
from paramsurgery.patterns.rule_file import RewriteRule
from paramsurgery.patterns.splits import resplit


class Rewrite(Pass, name="rewrite",
              summary="apply rewrite rules written in the .param format (a pattern and its replacement)"):
    rules: Sequence[RewriteRule] = ()
    max_rounds: int = 8

    def requires(self, g: Graph) -> None:
        if not self.rules:
            raise PassRefused("no rule given (--rule RULE.txt)")

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        explain = Explain()
        fired: dict[str, int] = {}
        for _round in range(self.max_rounds):
            changed = False
            for rule in self.rules:
                matches, near = find_matches(g, rule)
                if near is not None and rule.name not in fired:
                    explain.record(rule.name, near)
                # once per round (a scan of every blob): the matches of a round do not overlap,
                # so each one's Split tops are judged against the outputs before the round
                outputs_before = set(g.outputs) if matches else set()
                for m in matches:
                    self._apply(g, rule, m, result, outputs_before)
                    fired[rule.name] = fired.get(rule.name, 0) + 1
                    changed = True
            if not changed:
                break
        else:
            result.notes.append(f"stopped after {self.max_rounds} rounds that each rewrote "
                                f"something (a rule whose replacement matches again?)")
        result.modified = bool(fired)
        result.data["fired"] = fired
        for rule in self.rules:
            if rule.name not in fired:
                near = explain.best.get(rule.name)
                result.skipped.append(MatchFailure(rule.name, "never matched: " +
                                           (near.near_miss() if near else "no candidate")))
        return result

    def _apply(self, g: Graph, rule: RewriteRule, m: Binding, result: PassResult,
               outputs_before: set[str]) -> None:
        matched = [m.layers[lay.label] for lay in rule.pattern]
        line = m.layers[rule.pattern[-1].label].source_line
        # Splits that copy an internal top: all their readers are matched layers
        doomed = []
        for lay in rule.pattern:
            for pt in lay.tops:
                if not pt.startswith("%"):
                    doomed.extend(readers_through_splits(g, m.blobs[pt])[1])
        names = {lay.label: m.layers[lay.label].name for lay in rule.pattern}
        old = [f"{layer.type} {layer.name}" for layer in matched]
        params = {lay.label: {pid: m.layers[lay.label].params.value(pid)
                              for pid in m.layers[lay.label].params} for lay in rule.pattern}
        for s in {s.id: s for s in doomed}.values():
            g.remove_layer(s)
        for layer in matched:
            g.remove_layer(layer)
        fresh: dict[str, str] = {}

        def blob(name: str) -> str:
            if name.startswith("%"):
                return m.blobs[name]
            if name not in fresh:
                fresh[name] = g.unique_blob_name(name)
            return fresh[name]

        new = []
        for lay in rule.replacement:
            lname = names[lay.label[1:]] if lay.label.startswith("%") else g.unique_layer_name(lay.label)
            values: dict[int, Any] = dict(params[lay.copy_from]) if lay.copy_from else {}
            for pid, (label, ref) in lay.refs.items():
                v = params[label].get(ref)
                if v is None:
                    raise PassRefused(f"{rule.path}:{lay.line}: %{label}[{ref}]: {names[label]} does "
                                      f"not set param {ref}", line=line)
                values[pid] = v
            values.update(lay.params)
            layer = g.add_layer(lay.type, lname, [blob(b) for b in lay.bottoms],
                                [blob(t) for t in lay.tops], None)
            for pid, v in values.items():
                layer.params.set(pid, v)
            reads = [r.role for r in reads_for(layer.type, layer.params) or [] if r.count > 0]
            if reads:
                raise PassRefused(f"{rule.path}:{lay.line}: the replacement layer {lay.label} "
                                  f"({lay.type}) would read weights ({', '.join(reads)}); a rule "
                                  f"cannot create weights", line=line)
            new.append(f"{layer.type} {layer.name}")
        resplit(g, [m.blobs[b] for b in rule.inputs()] + [m.blobs[b] for b in rule.outputs()],
                outputs_before)
        result.changes.append(Change(names[rule.pattern[-1].label], f"rule {rule.name}",
                                     ", ".join(old), ", ".join(new) or "(nothing)", line))

