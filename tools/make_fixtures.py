#!/usr/bin/env python
"""Build the fixture set: the Qwen3-TTS 12Hz 0.6B nets (fixtures/qwen3_tts/) and, when
`tools/fixtures_repros.py` exists, the minimal pnnx bug repros; merge everything into
fixtures/manifest.json.

    python tools/make_fixtures.py [--size tiny|real|all] [--only MODULE ...] [--scratch DIR]
                                  [--out DIR]

Idempotent: models are built from our config values with fixed seeds, every export is
redone from scratch, and files of the selected modules/sizes are replaced; manifest records
of modules not selected are kept. Real-size exports are large (up to ~4.5 GB RSS and
several GB of intermediates each); they run one at a time in `--scratch` (outside the repo
by default) and only their `.param` files are kept.

Needs the export environment (torch 2.13.0 CPU, qwen-tts 0.1.1 --no-deps, transformers
4.57.3, pnnx 20261020, ncnn); see fixtures/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import fixture_manifest  # noqa: E402
from paramsurgery.core import progress  # noqa: E402
from fixture_manifest import sha256  # noqa: E402

SCHEMA = 1

# Output locations; `--out` re-roots them (the slow regeneration test builds into a temp dir).
FIXTURES = ROOT / "fixtures"
QWEN_DIR = FIXTURES / "qwen3_tts"
MANIFEST = FIXTURES / "manifest.json"
REPROS_DIR = FIXTURES / "repros"
# fixture directories whose manifest entries this script owns (rebuilt on every run)
GENERATED_HERE = ("qwen3_tts/", "repros/")


def set_output_root(root: Path) -> None:
    global FIXTURES, QWEN_DIR, MANIFEST, REPROS_DIR
    FIXTURES = root
    QWEN_DIR = root / "qwen3_tts"
    MANIFEST = root / "manifest.json"
    REPROS_DIR = root / "repros"


def load_manifest() -> dict[str, Any]:
    if MANIFEST.exists():
        return json.loads(MANIFEST.read_text())
    return {}


def write_manifest(manifest: dict[str, Any]) -> None:
    tmp = MANIFEST.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(MANIFEST)


# --------------------------------------------------------------------------- manifest parts

def level_sum_summary(exports: list[dict[str, Any]]) -> dict[str, Any]:
    """What each codec-decoder level-sum form did, read from the export records."""
    from qwen3tts import codec_decoder

    out: dict[str, Any] = {
        "chosen_for_ported": codec_decoder.PORTED_LEVEL_SUM,
        "why": ("the reference port sums the 15 acoustic levels with ones(1,15) @ "
                "emb.reshape(15,-1) on level-major ids; pnnx 20261020 turns the 15-level axis "
                "into ncnn's batch axis (Reshape 12=233 13=0) and the MatMul runs per batch "
                "element, so the output is wrong. A time-major id layout summed over a "
                "non-batch axis (view(T,15,d).sum(1)) and one Embed per level both convert "
                "right; the time-major form keeps the port's single fused acoustic table and "
                "two id inputs. Observed results per form and size below."),
        "forms": {},
    }
    for rec in exports:
        if rec["module"] != "codec_decoder" or rec["variant"].startswith("raw"):
            continue
        form = rec.get("notes", {}).get("level_sum")
        st = rec.get("status", {})
        out["forms"].setdefault(form, {})[rec["size"]] = {
            "variant": rec["variant"], "status": st.get("kind"),
            "max_rel_err": st.get("max_rel_err"),
            "batch_reshapes": _batch_reshapes(rec),
        }
    return out


def _batch_reshapes(rec: dict[str, Any]) -> list[str]:
    """`Reshape` lines of the kept .param that move an axis into/out of ncnn's batch."""
    path = rec.get("files", {}).get("ncnn_param")
    if not path:
        return []
    found = []
    for line in (FIXTURES / path).read_text().splitlines():
        toks = line.split()
        if toks and toks[0] == "Reshape" and any(t.startswith(("12=", "13=")) and
                                                 not t.endswith("=233") for t in toks):
            found.append(" ".join(toks[1:2] + [t for t in toks if t.startswith(("12=", "13=", "6="))]))
    return found


def file_entries(rec: dict[str, Any], versions: dict[str, Any], configs_ref: str,
                 seed: int) -> list[dict[str, Any]]:
    """One manifest entry per kept file, carrying everything the brief asks per file."""
    common = {
        "module": rec["module"], "variant": rec["variant"], "size": rec["size"],
        "config": configs_ref, "seed": seed, "input_shapes": rec["input_shapes"],
        "lengths": rec["lengths"], "versions": versions, "status": rec["status"],
    }
    for key in ("layer_count", "blob_count", "export_seconds", "io", "input_seed"):
        if key in rec:
            common[key] = rec[key]
    out = []
    for kind, rel in sorted(rec.get("files", {}).items()):
        p = FIXTURES / rel
        out.append({"path": rel, "kind": kind, "sha256": sha256(p), "bytes": p.stat().st_size,
                    **common})
    return out


def rebuild_files(manifest: dict[str, Any]) -> None:
    q = manifest.get("qwen3_tts", {})
    # each file keeps the versions (and arithmetic) it was generated with: its record's, else
    # its previous entry's; the run's only for what has neither
    previous = {e["path"]: e.get("versions") for e in manifest.get("files", [])
                if isinstance(e, dict) and "path" in e}
    run_versions = manifest.get("versions", {})

    def made_with(rec: dict[str, Any], path: str) -> dict[str, Any]:
        return rec.get("versions") or previous.get(path) or run_versions

    files: list[dict[str, Any]] = []
    for rec in q.get("exports", []):
        files += file_entries(rec, made_with(rec, ""), rec["config"], rec["seed"])
    for kv in q.get("kvcache", []):
        p = FIXTURES / kv["path"]
        versions = made_with(kv, kv["path"])
        files.append({"path": kv["path"], "kind": "kvcache_reference", "module": kv["module"],
                      "variant": "ported", "size": kv["size"], "config": kv["config"],
                      "seed": kv["seed"], "versions": versions, "sha256": sha256(p),
                      "bytes": p.stat().st_size, "convention": kv["convention"]})
    e2e = q.get("e2e")
    if e2e:
        p = FIXTURES / e2e["path"]
        versions = made_with(e2e, e2e["path"])
        files.append({"path": e2e["path"], "kind": "e2e_reference", "module": "pipeline",
                      "variant": "hf", "size": e2e["size"], "seed": e2e["input_seed"],
                      "versions": versions, "sha256": sha256(p), "bytes": p.stat().st_size,
                      "description": e2e})
    for entry in manifest.get("repros", []):
        if isinstance(entry, dict) and "path" in entry:
            files.append(entry)
    # entries of the other generators' directories (repairs/, streaming/, ... listed by
    # tools/fixture_manifest.py) are not this function's to drop
    made = {e["path"] for e in files}
    kept = [e for e in manifest.get("files", [])
            if e["path"] not in made and not e["path"].startswith(GENERATED_HERE)]
    manifest["files"] = sorted(files + kept, key=lambda e: e["path"])


# --------------------------------------------------------------------------- qwen3-tts

def build_qwen(sizes: list[str], only: list[str] | None, scratch: Path,
               manifest: dict[str, Any]) -> None:
    from qwen3tts import configs, modules
    from qwen3tts.env import tool_versions

    versions = tool_versions()
    manifest["versions"] = versions
    q = manifest.setdefault("qwen3_tts", {})
    q["configs"] = {size: configs.SIZES[size] for size in ("tiny", "real")}
    q.setdefault("sources", {})
    q.setdefault("exports", [])
    q.setdefault("kvcache", [])
    q["layout"] = ("qwen3_tts/<size>/<module>.<variant>.{ncnn.param,ncnn.bin,pnnx.param,ref.npz}; "
                   "<module>.kvcache.npz for the decoder stacks (tiny); real size keeps "
                   ".param files only")

    selected = [m for m in modules.MODULES if only is None or m in only]
    # a module's build takes seconds (tiny) to minutes (real): a line per variant as it
    # finishes, and a bar over the modules on a terminal (paramsurgery's reporter)
    with progress.task("fixtures", total=len(sizes) * len(selected), unit="module") as task:
        _build_qwen_modules(sizes, selected, scratch, manifest, q, versions, task)
    # drop stale files of selected modules that no record lists any more
    listed = {e["path"] for e in manifest.get("files", [])}
    for size in sizes:
        for module in selected:
            for p in (QWEN_DIR / size).glob(f"{module}.*"):
                if p.relative_to(FIXTURES).as_posix() not in listed:
                    p.unlink()



def _build_qwen_modules(sizes: list[str], selected: list[str], scratch: Path,
                        manifest: dict[str, Any], q: dict[str, Any], versions: dict[str, Any],
                        task: Any) -> None:
    """Export every selected module at every size; the manifest is written after each
    module (an interrupted build keeps what finished)."""
    from qwen3tts import kvcache_reference, modules, pipeline, sources
    from qwen3tts.npz import save_npz

    for size in sizes:
        current_source = None
        for module in selected:
            source, builder = modules.MODULES[module]
            if current_source not in (None, source):
                sources.release(current_source)
            current_source = source
            t0 = time.monotonic()
            progress.line(f"[{size}] {module}: building")
            specs = builder(size)
            q["sources"][f"{source}/{size}"] = {
                **sources.describe(source, size),
                "configs": [f"qwen3_tts.configs.{size}.{part}"
                            for part in modules.SOURCE_CONFIG_PARTS[source]]}
            records = []
            for spec in specs:
                rec = pipeline.export_variant(spec, size, QWEN_DIR / size, scratch, FIXTURES)
                rec["config"] = f"qwen3_tts.configs.{size}.{spec.config_part}"
                rec["seed"] = sources.SEEDS[source]
                rec["versions"] = versions
                st = rec["status"]
                progress.line(f"[{size}] {module}.{spec.variant}: {st['kind']}"
                      + (f" rel {st['max_rel_err']:.2e}" if st.get("max_rel_err") is not None else "")
                      + (f" layers {rec.get('layer_count')}" if "layer_count" in rec else ""))
                records.append(rec)
            q["exports"] = [r for r in q["exports"]
                            if (r["module"], r["size"]) != (module, size)] + records
            q["exports"].sort(key=lambda r: (r["size"], list(modules.MODULES).index(r["module"]),
                                             r["variant"]))
            if size == "tiny" and module in modules.KV_MODULES:
                arrays, convention = kvcache_reference.build(module, size)
                path = QWEN_DIR / size / f"{module}.kvcache.npz"
                save_npz(path, arrays)
                part = "talker" if module == "talker_decoder" else "predictor"
                q["kvcache"] = [k for k in q["kvcache"]
                                if (k["module"], k["size"]) != (module, size)]
                q["kvcache"].append({"module": module, "size": size,
                                     "path": path.relative_to(FIXTURES).as_posix(),
                                     "config": f"qwen3_tts.configs.{size}.{part}",
                                     "seed": sources.SEEDS[source], "convention": convention,
                                     "versions": versions})
            q["level_sum"] = level_sum_summary(q["exports"])
            rebuild_files(manifest)
            write_manifest(manifest)
            task.done(f"[{size}] {module}: done in {time.monotonic() - t0:.0f} s")
        sources.release()


def build_e2e(manifest: dict[str, Any]) -> None:
    """The end-to-end torch reference (tiny): greedy generation by the qwen-tts modeling code
    with the fixtures' weights + its waveform (`qwen3tts/e2e_reference.py`)."""
    from qwen3tts import configs, e2e_reference, sources
    from qwen3tts.env import tool_versions
    from qwen3tts.npz import save_npz

    t0 = time.monotonic()
    print("[tiny] e2e: generating the torch reference", flush=True)
    arrays = e2e_reference.build("tiny")
    path = QWEN_DIR / "tiny" / "e2e.ref.npz"
    save_npz(path, arrays)
    q = manifest.setdefault("qwen3_tts", {})
    for size, parts in q.setdefault("configs", {}).items():
        parts["tts"] = configs.SIZES[size]["tts"]
    q["e2e"] = {"path": path.relative_to(FIXTURES).as_posix(), "size": "tiny",
                **e2e_reference.describe(arrays), "versions": tool_versions()}
    sources.release()
    rebuild_files(manifest)
    write_manifest(manifest)
    print(f"[tiny] e2e: done in {time.monotonic() - t0:.0f} s", flush=True)


# --------------------------------------------------------------------------- repros

def _normalize_repro_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """Manifest paths are relative to the fixtures root; fixtures_repros writes them relative
    to the repository (or absolute outside it) and names the size `size`."""
    entry = dict(entry)
    if isinstance(entry.get("path"), str):
        p = Path(entry["path"])
        full = (p if p.is_absolute() else ROOT / p).resolve()
        try:
            entry["path"] = full.relative_to(FIXTURES.resolve()).as_posix()
        except ValueError:
            pass
    if "bytes" not in entry and "size" in entry and isinstance(entry["size"], int):
        entry["bytes"] = entry["size"]
    return entry


def build_repros(manifest: dict[str, Any]) -> bool:
    """Run `tools/fixtures_repros.build(out_dir)` (the repro engineer's generator) if it
    exists; its entries go into the same manifest."""
    path = ROOT / "tools" / "fixtures_repros.py"
    if not path.exists():
        print("tools/fixtures_repros.py not present: repros skipped", flush=True)
        return False
    spec = importlib.util.spec_from_file_location("fixtures_repros", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    entries = mod.build(REPROS_DIR)
    manifest["repros"] = [_normalize_repro_entry(e) for e in entries]
    rebuild_files(manifest)
    write_manifest(manifest)
    return True


def main(argv: list[str] | None = None) -> int:
    from qwen3tts.env import pin_arithmetic

    pin_arithmetic()  # before anything imports torch (qwen3tts/env.py says why)
    from qwen3tts.modules import MODULES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=["tiny", "real", "all"], default="all")
    ap.add_argument("--only", nargs="+", metavar="MODULE",
                    help=f"subset of: {', '.join(MODULES)}, e2e, repros")
    ap.add_argument("--scratch", type=Path, default=None,
                    help="work directory for pnnx runs (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=None,
                    help="fixtures root to write (default: the repository's fixtures/)")
    args = ap.parse_args(argv)
    if args.out is not None:
        set_output_root(args.out.resolve())
        FIXTURES.mkdir(parents=True, exist_ok=True)
    known = set(MODULES) | {"repros", "e2e"}
    if args.only:
        bad = [m for m in args.only if m not in known]
        if bad:
            ap.error(f"unknown module(s): {', '.join(bad)}")
    sizes = ["tiny", "real"] if args.size == "all" else [args.size]
    qwen_only = None if args.only is None else [m for m in args.only if m in MODULES]

    own_scratch = args.scratch is None
    scratch = Path(tempfile.mkdtemp(prefix="paramsurgery-fixtures-")) if own_scratch \
        else args.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest()
    manifest["schema"] = SCHEMA
    manifest["generator"] = "python tools/make_fixtures.py"
    try:
        # lines as they finish; a bar on a terminal (core/progress.py)
        with progress.use_console(stream=sys.stdout):
            if qwen_only is None or qwen_only:
                build_qwen(sizes, qwen_only, scratch, manifest)
            if "tiny" in sizes and (args.only is None or "e2e" in args.only):
                build_e2e(manifest)
            if args.only is None or "repros" in args.only:
                build_repros(manifest)
            rebuild_files(manifest)
            fixture_manifest.update(manifest, FIXTURES)   # files the generators above do not list
            write_manifest(manifest)
    finally:
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
