"""The JSON each command prints with `--format json`: one JSON Schema per command.

Every report is one JSON object (never a bare list, whatever the number of files) with a
`files` list: one object per file the command read or wrote, `{"file": path, "role": ...}`
(roles: `input`, `weights`, `output`, `output weights`, `reference`, a manifest's name,
...), and where a command reports per file (info, validate, lint), that file's results in
its entry. Values are machine values: numbers, booleans, names, lists; ranges are closed
(`first`, `last`: the positions the text shows as `first..last`). README "JSON output" lists
the fields; `tests/test_cli_conformance.py` validates every command's output against these.
"""

from __future__ import annotations

from typing import Any

STR: dict = {"type": "string"}
INT: dict = {"type": "integer"}
NUM: dict = {"type": "number"}
BOOL: dict = {"type": "boolean"}
ANY: dict = {}


def nullable(s: dict) -> dict:
    return {"anyOf": [s, {"type": "null"}]}


def arr(items: dict = ANY, min_items: int = 0) -> dict:
    return {"type": "array", "items": items, "minItems": min_items}


def obj(required: dict[str, dict], optional: dict[str, dict] | None = None) -> dict:
    """An object with these fields (and possibly more)."""
    return {"type": "object", "required": sorted(required),
            "properties": {**required, **(optional or {})}}


FILE = obj({"file": STR, "role": STR})
FILES = arr(FILE, 1)
FINDING = obj({"code": STR, "severity": {"enum": ["error", "warning", "info"]},
               "message": STR}, {"layer": nullable(STR), "line": nullable(INT)})
CHANGE = obj({"layer": STR, "what": STR}, {"line": nullable(INT)})
PASS = {  # every graph-writing command (`_runner.GraphCommand`)
    "pass": STR, "output": STR, "written": BOOL, "modified": BOOL, "changes": arr(CHANGE),
    "skipped": arr(obj({})), "notes": arr(STR), "contract_changes": arr(ANY), "files": FILES}
STEP = obj({"label": STR, "first": INT, "last": INT, "max_abs": NUM, "max_rel": NUM,
            "ok": BOOL})
PARITY = obj({"ok": BOOL, "n": INT, "m": INT, "tol": NUM, "error": nullable(STR),
              "reference_rel": nullable(NUM), "steps": arr(STEP)})
LAYER_STATE = nullable(obj({"type": STR, "bottoms": arr(STR), "tops": arr(STR),
                            "params": {"type": "object"}}))


def pass_report(**extra: dict) -> dict:
    # `not_verified` (optional): what a run that modified the graph did not prove
    return obj({**PASS, **extra}, {"not_verified": STR})


SCHEMAS: dict[str, dict[str, Any]] = {
    "demo": obj({"ok": BOOL, "steps": arr(obj({"step": INT, "title": STR, "ok": BOOL,
                                               "lines": arr(STR)}), 1), "files": FILES}),
    "info": obj({"files": arr(obj({"file": nullable(STR), "format": STR, "layers": INT,
                                   "blobs": INT, "inputs": arr(STR), "outputs": arr(STR)}),
                              1)}),
    "shapes": obj({"blobs": {"type": "object", "additionalProperties": obj({})},
                   "notes": arr(STR), "files": FILES}),
    "validate": obj({"files": arr(obj({"file": STR, "findings": arr(FINDING)}), 1)}),
    # lint's own golden form (tests/golden/lint/static.json): its per-file status is in
    # `summary` (`passing`, `failing`, `unreadable`), every entry names its file
    "lint": obj({"summary": obj({"passing": arr(STR), "failing": arr(STR),
                                 "unreadable": arr(obj({"file": STR}))}),
                 "lint_entries": arr(obj({"file": STR, "code": STR, "severity": STR,
                                          "message": STR}))}),
    "compare": obj({"status": STR, "first_divergence": nullable(obj({"layer": STR})),
                    "coverage": obj({"compared": INT, "blobs": INT}),
                    "blobs": arr(obj({"blob": STR, "status": STR})), "notes": arr(STR),
                    "atol": NUM, "rtol": NUM, "files": FILES}),
    "fmt": obj({"output": STR, "layers": INT, "blobs": INT, "files": FILES}),
    "synth-bin": obj({"output": STR, "bytes": INT, "dtype": {"enum": ["fp32", "fp16", "bf16"]},
                      "layers": INT, "seed": INT, "files": FILES}),
    "add-kvcache": pass_report(
        header=obj({"before": arr(INT, 2), "after": arr(INT, 2)}),
        changes=arr(obj({"layer": STR, "what": STR, "before": LAYER_STATE,
                         "after": LAYER_STATE})),
        cache=arr(obj({"layer": STR, "index": INT, "k_in": STR, "v_in": STR, "k_out": STR,
                       "v_out": STR})),
        parity=nullable(PARITY)),
    "verify-kvcache": obj({**PARITY["properties"], "files": FILES}),
    "fold-explicit-cache": pass_report(),
    "fix": pass_report(findings_before=arr(FINDING), findings_after=arr(FINDING),
                       passes=arr(ANY), refused=arr(ANY)),
    "fix-reduction": pass_report(),
    "fix-slice": pass_report(),
    "dynamize": pass_report(),
    "fix-batch-reshape": pass_report(),
    "fix-tied-linear": pass_report(),
    "fix-pow": pass_report(),
    "fix-lossy-reshape": pass_report(),
    "fuse-codebooks": pass_report(outputs=arr(STR), manifest=ANY,
                                  untouched_weights_identical=nullable(INT)),
    "fold-gqa": pass_report(folded=arr(ANY), unloadable={"type": "object"}),
    "extract": pass_report(layers=INT, source_layers=INT, inputs=arr(STR)),
    "add-conv-cache": pass_report(outputs=arr(STR), manifest=ANY),
    "stream-check": obj({"ok": BOOL, "frames": INT, "samples": INT, "offline_samples": INT,
                         "max_abs": NUM, "rel": NUM, "tol": NUM,
                         "chunks": arr(obj({})), "flush_samples": INT,
                         "problems": arr(STR), "states": INT,
                         "samples_per_frame": {"type": "object", "additionalProperties": INT},
                         "files": FILES}),
    "set-param": pass_report(),
    "lower": pass_report(),
    "remove-passthrough": pass_report(),
    "merge-inputs": pass_report(),
    "rename-blobs": pass_report(),
    "insert": pass_report(),
    "repro list": obj({"cases": arr(obj({"id": STR, "number": {"type": ["integer", "string"]},
                                         "title": STR}), 1),
                       "files": arr(FILE)}),
    "repro check": obj({"environment": obj({}), "cases": arr(obj({}))}),
    "repro issue": obj({"case": STR, "output": STR, "files": FILES}),
    "reduce": obj({"runs": INT, "steps": INT, "seconds": NUM, "files": FILES}),
    "view": obj({"output": STR, "layers": INT, "drawn": INT, "blobs": INT,
                 "shapes_known": INT, "around": nullable(STR), "depth": nullable(INT),
                 "files": FILES}),
    "diff": obj({"a": STR, "b": STR, "added": arr(ANY), "removed": arr(ANY),
                 "changed": arr(ANY), "renamed": arr(ANY), "files": arr(FILE, 2)}),
    "rewrite": pass_report(fired=ANY, proven=BOOL),
    "fold-constant-layout": pass_report(),
    "precision": obj({"param": STR, "mode": {"enum": ["fp16", "bf16", "int8"]}, "metric": STR,
                      "tol": NUM, "reference": {"enum": ["fp32", "torch"]},
                      "kept": arr(ANY), "verdict": STR, "runs": INT,
                      "files": FILES}),
    "keep-precision": pass_report(),
    "quantize": obj({"param": STR, "int8_layers": arr(STR), "errors": {"type": "object"},
                     "files": FILES}),
    "quantize-int8": pass_report(),
    "passes": obj({"passes": arr(obj({"name": STR, "summary": STR,
                                      "command": nullable(STR)}), 1)}),
}


def schema_of(command: str) -> dict[str, Any]:
    """The schema of `command`'s JSON (a pass declaring its own command: a pass report)."""
    return SCHEMAS.get(command, pass_report())
