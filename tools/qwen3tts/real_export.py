"""The real-size nets of the pipeline with the weights torch runs: exported by the fixture
generator's own specs (the seeded source models of `sources.get`, real configs) with pnnx,
`.bin` kept in a work directory (never in the repository: ~2.9 GB).

Why not `synth-bin`: synth weights are random numbers unrelated to any torch model, so
nothing could be compared with torch. Here both sides hold the same weights: this export
and `e2e_reference.build("real")` build the same seeded source models (`sources.SEEDS`,
`weights.randomize_`, arithmetic pinned by `env.pin_arithmetic`).

Each exported `.ncnn.param` must be byte-identical to the fixture's `.param`
(fixtures/manifest.json sha256): then the fixture's manifest record (blob names, batch
axes, notes) describes this `.bin`, and `assemble.assemble(..., bins=...)` builds the
pipeline from the fixture graphs with these weights by paramsurgery's passes alone. A
different `.param` (a pnnx or generator change since the fixtures were made) is refused,
naming the file, rather than pairing a stale graph with new weights.

A work directory is reused: a `.bin` whose stamp (fixture sha256 + seed) matches is not
exported again.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from fixture_manifest import sha256

from . import assemble

SIZE = "real"
LEVELSUM_PREFIX = "ported_levelsum_"


class StaleFixture(RuntimeError):
    """The generator's export no longer matches the committed fixture `.param`."""


def needed() -> list[tuple[str, str]]:
    """(module, variant) of every source graph the assembled pipeline reads (in SOURCES'
    order, where the modules of one source model are adjacent: each built once)."""
    return list(dict.fromkeys(assemble.SOURCES.values()))


def _spec(module: str, variant: str) -> Any:
    from . import codec_decoder, modules

    if module == "codec_decoder" and variant.startswith(LEVELSUM_PREFIX):
        # build_all would trace every level-sum form and the raw exports: only this one
        return codec_decoder.build(SIZE, variant[len(LEVELSUM_PREFIX):], variant=variant)
    for spec in modules.MODULES[module][1](SIZE):
        if spec.variant == variant:
            return spec
    raise KeyError(f"{module} has no variant {variant}")


def _fixture_sha(manifest: dict[str, Any], module: str, variant: str) -> tuple[str, str]:
    rec = assemble.export_record(manifest, module, variant, SIZE)
    rel = rec["files"]["ncnn_param"]
    for entry in manifest["files"]:
        if entry["path"] == rel:
            return rel, entry["sha256"]
    raise KeyError(f"{rel} has no entry in fixtures/manifest.json")


def export(work: Path, manifest: dict[str, Any], log: list[str]) -> dict[str, Path]:
    """`.bin` per `module.variant` (the `bins` argument of `assemble.assemble`)."""
    from paramsurgery.repro import pnnx_export

    work.mkdir(parents=True, exist_ok=True)
    bins: dict[str, Path] = {}
    current = None
    for module, variant in needed():
        key = f"{module}.{variant}"
        rel, want = _fixture_sha(manifest, module, variant)
        # the fixture's seed is its source model's (sources.SEEDS): modules of one source
        # share it
        seed = assemble.export_record(manifest, module, variant, SIZE)["seed"]
        stamp_path = work / f"{key}.stamp.json"
        out = work / f"{key}.ncnn.bin"
        stamp = {"fixture_param": rel, "sha256": want, "seed": seed}
        if out.exists() and stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
            bins[key] = out
            log.append(f"export {key}: reused {out} ({out.stat().st_size / 1e6:.0f} MB)")
            continue
        if current not in (None, seed):
            _release()      # the next source model: drop the previous one (~3.6 GB)
        current = seed
        t0 = time.monotonic()
        spec = _spec(module, variant)
        scratch = work / f"scratch-{key}"
        shutil.rmtree(scratch, ignore_errors=True)
        res = pnnx_export.export_with_pnnx(spec.wrapper, spec.trace_inputs, scratch, key,
                               example_inputs2=spec.trace_inputs2, fp16=False, optlevel=2)
        if not res.ok:
            raise RuntimeError(f"pnnx failed on {key} (exit {res.returncode}, signal "
                               f"{res.signal}): {res.stderr.strip()[-800:]}")
        got = sha256(res.ncnn_param)
        if got != want:
            raise StaleFixture(
                f"{key}: the generator's export {res.ncnn_param} (sha256 {got[:12]}) differs "
                f"from the fixture fixtures/{rel} (sha256 {want[:12]}); regenerate the fixtures "
                f"(python tools/make_fixtures.py --size real --only {module}) first")
        shutil.move(str(res.ncnn_bin), out)
        shutil.rmtree(scratch, ignore_errors=True)
        stamp_path.write_text(json.dumps(stamp))
        bins[key] = out
        log.append(f"export {key}: .param == fixtures/{rel}; .bin "
                   f"{out.stat().st_size / 1e6:.0f} MB in {time.monotonic() - t0:.0f} s")
    _release()
    return bins


def _release() -> None:
    # torch-side modules are imported lazily: `needed()` serves the ncnn side, which may
    # have no torch
    from . import sources

    sources.release()
