"""`paramsurgery demo`: the main job on the bundled default graph, end to end.

Each step prints what it did and what it checked; any failed check makes the demo exit 1.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Callable

from paramsurgery.core.text import count
from paramsurgery.formats.io import load
from paramsurgery.core.resources import fixture
from paramsurgery.analysis.summary import format_summary, summarize
from paramsurgery.formats.io import save
from paramsurgery.analysis.validate import validate

DEFAULT_GRAPH = "qwen3_tts/tiny/talker_decoder.ported.ncnn.param"


class DemoFailed(Exception):
    pass


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def step_lint(ctx: dict) -> None:
    from paramsurgery.lint import lint_file, ran_through_ncnn

    record: list = []
    findings = lint_file(ctx["param"], record=record)
    for f in findings:
        _say("  " + f.format())
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise DemoFailed(f"lint found {len(errors)} error(s)")
    made, why = ran_through_ncnn(record[0]) if record else ([], "not linted")
    for line in made:
        _say(f"  ran through ncnn at the {line}")
    if made:
        how = f"static rules + {len(made)} run(s) through ncnn"
    else:
        how = f"static rules only; not run: {why}"
        ctx["skipped"].append(f"lint's ncnn run ({why})")
    _say(f"lint: {len(findings)} finding(s), none an error ({how})")


def step_info(ctx: dict) -> None:
    g = load(ctx["param"])
    ctx["graph"] = g
    _say(format_summary(summarize(g)))


def step_validate(ctx: dict) -> None:
    findings = validate(ctx["graph"])
    for f in findings:
        _say("  " + f.format(str(ctx["param"])))
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise DemoFailed(f"validate found {len(errors)} error(s)")
    _say(f"validate: ok ({len(findings)} finding(s), none an error)")


def step_round_trip(ctx: dict) -> None:
    src = Path(ctx["param"]).read_bytes()
    out = Path(ctx["workdir"]) / "roundtrip.param"
    save(ctx["graph"], out)
    dst = out.read_bytes()
    if src != dst:
        raise DemoFailed("round trip changed the file")
    sha = hashlib.sha256(dst).hexdigest()[:16]
    _say(f"round trip: {len(dst)} bytes, byte-identical (sha256 {sha}...)")
    import ncnn

    net = ncnn.Net()
    ret = net.load_param(str(out))
    if ret != 0:
        raise DemoFailed(f"ncnn rejected the written file (load_param returned {ret})")
    _say(f"ncnn load_param on the written file: 0 ({count(len(net.layers()), 'layer')})")


def step_add_kvcache(ctx: dict) -> None:
    from paramsurgery.passes.kvcache import AddKVCache

    g = ctx["graph"]
    if not g.by_type("SDPA", "MultiHeadAttention"):
        _say("no attention layer: skipped")
        ctx["skipped"].append("add-kvcache (no attention layer)")
        return
    result = AddKVCache()(g)
    _say(result.format())
    out = Path(ctx["workdir"]) / "kvcache.param"
    save(result.graph, out)
    ctx["kv_param"] = out
    _say(f"header: {len(g)} {g.blob_count()} -> {len(result.graph)} {result.graph.blob_count()}")
    again = AddKVCache()(result.graph)
    if again.modified:
        raise DemoFailed("add-kvcache is not idempotent")
    _say("running it again changes nothing (idempotent)")


def step_kv_parity(ctx: dict) -> None:
    from paramsurgery.verify.kvcache import verify_kvcache

    if "kv_param" not in ctx:
        _say("no kv-cache graph: skipped")
        ctx["skipped"].append("kv-cache parity (no kv-cache graph)")
        return
    bin_path = Path(ctx.get("bin") or str(ctx["param"]).replace(".param", ".bin"))
    if not bin_path.exists():
        _say(f"no weights next to {ctx['param']}: parity skipped")
        ctx["skipped"].append(f"kv-cache parity (no {bin_path.name} next to the file)")
        return
    report = verify_kvcache(ctx["kv_param"], bin_path, n=9, m=4, reference_param=ctx["param"])
    from paramsurgery.core import progress

    rest = progress.unshown(report.format())  # the steps were shown as they finished
    if rest:
        _say(rest)
    if not report.ok:
        raise DemoFailed("kv-cache parity failed")


STEPS: list[tuple[str, Callable[[dict], None]]] = [
    ("lint", step_lint),
    ("info", step_info),
    ("validate", step_validate),
    ("round trip", step_round_trip),
    ("add-kvcache", step_add_kvcache),
    ("kv-cache parity through ncnn (untraced lengths)", step_kv_parity),
]


def run_demo(param: str | None = None, bin: str | None = None) -> int:
    path = Path(param) if param else fixture(DEFAULT_GRAPH)
    with tempfile.TemporaryDirectory(prefix="paramsurgery-demo-") as tmp:
        ctx: dict = {"param": path, "workdir": tmp, "bin": bin, "skipped": []}
        for i, (title, fn) in enumerate(STEPS, 1):
            _say(f"\n== {i}. {title}")
            try:
                fn(ctx)
            except DemoFailed as exc:
                _say(f"FAILED: {exc}")
                return 1
    skipped = ctx["skipped"]
    if skipped:
        _say(f"\ndemo: every step that ran passed; not done: {'; '.join(skipped)}")
    else:
        _say("\ndemo: all steps passed")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo())
