"""fixtures/manifest.json lists every fixture file with its sha256 (tools/fixture_manifest.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import fixture_manifest as fm  # noqa: E402


def test_every_fixture_file_is_listed_with_its_sha256() -> None:
    manifest = json.loads(fm.MANIFEST.read_text())
    assert fm.problems(manifest) == []


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "fixtures"
    (root / "repairs" / "case").mkdir(parents=True)
    (root / "qwen3_tts").mkdir()
    (root / "README.md").write_text("doc")
    (root / "__init__.py").write_text("")
    (root / "repairs" / "case" / "m.ncnn.param").write_text("7767517\n")
    (root / "repairs" / "case" / "m.ref.npz").write_bytes(b"npz")
    (root / "qwen3_tts" / "t.ncnn.param").write_text("rich")
    rich = {"path": "qwen3_tts/t.ncnn.param", "sha256": fm.sha256(root / "qwen3_tts/t.ncnn.param"),
            "bytes": 4, "kind": "ncnn_param", "module": "talker_decoder", "status": {"kind": "ok"}}
    (root / "manifest.json").write_text(json.dumps({"files": [rich]}))
    return root


def test_update_adds_plain_entries_and_leaves_rich_ones_alone(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    rich_before = dict(manifest["files"][0])
    assert sorted(fm.problems(manifest, root)) == ["repairs/case/m.ncnn.param: not listed",
                                                   "repairs/case/m.ref.npz: not listed"]
    assert fm.update(manifest, root) == (2, 0, 0)
    assert fm.problems(manifest, root) == []
    by_path = {e["path"]: e for e in manifest["files"]}
    assert by_path["qwen3_tts/t.ncnn.param"] == rich_before
    plain = by_path["repairs/case/m.ref.npz"]
    assert plain == {"path": "repairs/case/m.ref.npz", "sha256": fm.sha256(root / plain["path"]),
                     "bytes": 3, "kind": "reference", "origin": "python tools/fixtures_repairs.py",
                     "listed_by": fm.LISTED_BY}
    assert fm.update(manifest, root) == (0, 0, 0)          # idempotent


def test_update_refreshes_and_prunes_its_own_entries_only(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    fm.update(manifest, root)
    (root / "repairs" / "case" / "m.ref.npz").write_bytes(b"changed")
    (root / "repairs" / "case" / "m.ncnn.param").unlink()
    (root / "qwen3_tts" / "t.ncnn.param").write_text("edited")
    problems = fm.problems(manifest, root)
    assert "qwen3_tts/t.ncnn.param: sha256 differs from the file (a generator's entry: rerun " \
           "its generator)" in problems
    assert fm.update(manifest, root) == (0, 1, 1)
    # the rich entry is never rewritten: its stale hash is still reported
    assert fm.problems(manifest, root) == [
        ("qwen3_tts/t.ncnn.param: sha256 differs from the file (a generator's entry: rerun its "
         "generator)")]


@pytest.mark.parametrize("name,kind", [("a.ncnn.param", "ncnn_param"), ("a.pnnx.param", "pnnx_param"),
                                       ("a.param.bin", "ncnn_param_bin"), ("a.ref.npz", "reference"),
                                       ("a.param", "ncnn_param"), ("cases.json", "json"),
                                       ("SOURCES.md", "document"), ("x.weird", "data")])
def test_kind_from_the_file_name(name: str, kind: str) -> None:
    assert fm.kind_of(name) == kind
