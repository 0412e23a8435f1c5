#!/usr/bin/env python
"""List every fixture file in fixtures/manifest.json with its sha256.

    python tools/fixture_manifest.py            # check: exit 1 and list what is wrong
    python tools/fixture_manifest.py --update   # add / refresh the entries this tool owns

Every file under fixtures/ is listed except `README.md`, `__init__.py` and the manifest
itself. The Qwen3-TTS and repro generators (`tools/make_fixtures.py`) write rich entries
(module, variant, config, status, ...); the other fixture generators (repairs/, streaming/,
handpatch/, fusions/) and the copied ncnn corpus get a plain entry from this tool: `path`,
`sha256`, `bytes`, `kind` (from the file name) and `origin` (the generator or source).

`--update` never touches a rich entry: a rich entry whose file changed is reported (rerun
its generator). Entries this tool wrote (`"listed_by": "tools/fixture_manifest.py"`) are
refreshed when their file changed and dropped when it is gone. The manifest is rewritten
the way make_fixtures writes it (indent 1, sorted keys), atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
MANIFEST = FIXTURES / "manifest.json"
LISTED_BY = "tools/fixture_manifest.py"
UNLISTED_NAMES = ("README.md", "__init__.py")

# file-name ending -> kind (longest ending first)
KINDS: tuple[tuple[str, str], ...] = (
    (".ncnn.param", "ncnn_param"), (".pnnx.param", "pnnx_param"), (".ncnn.bin", "ncnn_bin"),
    (".param.bin", "ncnn_param_bin"), (".ref.npz", "reference"), (".param", "ncnn_param"),
    (".bin", "ncnn_bin"), (".npz", "arrays"), (".json", "json"), (".md", "document"),
    (".py", "source"), (".txt", "text"),
)
# top-level fixture directory -> where its files come from
ORIGINS: dict[str, str] = {
    "repairs": "python tools/fixtures_repairs.py",
    "streaming": "python tools/fixtures_streaming.py",
    "handpatch": "python tools/fixtures_handpatch.py",
    "fusions": "python tools/fixtures_fusions.py",
    "ncnn_corpus": "copied from /work/shared/corpus/ncnn (see ncnn_corpus/SOURCES.md)",
    "qwen3_tts": "python tools/make_fixtures.py",
    "repros": "python tools/make_fixtures.py --only repros",
    "fold_constants": "python tools/fixtures_fold_constants.py",
    "encoder": "python tools/fixtures_encoder.py",
    "precision": "python tools/fixtures_precision.py",
    "rewrite": "hand-written: the examples of README \"Rewrite rules\"",
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def kind_of(name: str) -> str:
    for ending, kind in KINDS:
        if name.endswith(ending):
            return kind
    return "data"


def fixture_files(root: Path = FIXTURES) -> list[str]:
    """Every file that must be listed, as a path relative to `root` (sorted)."""
    manifest = root / "manifest.json"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and p.name not in UNLISTED_NAMES and p != manifest
                  and "__pycache__" not in p.parts)


def plain_entry(root: Path, rel: str) -> dict[str, Any]:
    path = root / rel
    top = rel.split("/", 1)[0]
    return {"path": rel, "sha256": sha256(path), "bytes": path.stat().st_size,
            "kind": kind_of(path.name), "origin": ORIGINS.get(top, "fixtures/" + top),
            "listed_by": LISTED_BY}


def problems(manifest: dict[str, Any], root: Path = FIXTURES) -> list[str]:
    """What keeps the manifest from listing every fixture file with its right sha256."""
    out = []
    entries = {e["path"]: e for e in manifest.get("files", [])}
    on_disk = fixture_files(root)
    for rel in on_disk:
        e = entries.get(rel)
        if e is None:
            out.append(f"{rel}: not listed")
        elif "sha256" not in e:
            out.append(f"{rel}: listed without sha256")
        elif e["sha256"] != sha256(root / rel):
            out.append(f"{rel}: sha256 differs from the file"
                       + ("" if e.get("listed_by") == LISTED_BY
                          else " (a generator's entry: rerun its generator)"))
    present = set(on_disk)
    for rel in entries:
        if rel not in present and not (root / rel).is_file():
            out.append(f"{rel}: listed but not on disk")
    return out


def update(manifest: dict[str, Any], root: Path = FIXTURES) -> tuple[int, int, int]:
    """Add plain entries for unlisted files, refresh and prune this tool's own entries.
    Returns (added, refreshed, removed)."""
    files = manifest.setdefault("files", [])
    by_path = {e["path"]: e for e in files}
    on_disk = set(fixture_files(root))
    added = refreshed = 0
    for rel in sorted(on_disk):
        e = by_path.get(rel)
        if e is None:
            files.append(plain_entry(root, rel))
            added += 1
        elif e.get("listed_by") == LISTED_BY and e.get("sha256") != sha256(root / rel):
            e.update(plain_entry(root, rel))
            refreshed += 1
    keep = [e for e in files if not (e.get("listed_by") == LISTED_BY
                                     and e["path"] not in on_disk)]
    removed = len(files) - len(keep)
    manifest["files"] = sorted(keep, key=lambda e: e["path"])
    return added, refreshed, removed


def write(manifest: dict[str, Any], path: Path = MANIFEST) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true",
                    help="add entries for unlisted files and refresh this tool's own entries")
    args = ap.parse_args(argv)
    manifest = json.loads(MANIFEST.read_text())
    if args.update:
        added, refreshed, removed = update(manifest)
        if added or refreshed or removed:
            write(manifest)
        print(f"fixture manifest: {added} added, {refreshed} refreshed, {removed} removed; "
              f"{len(manifest['files'])} entries")
    left = problems(manifest)
    for p in left:
        print(p)
    if not args.update:
        print(f"fixture manifest: {len(fixture_files())} files, {len(left)} problem(s)")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
