"""`paramsurgery repro list|check|issue`.

Without torch/pnnx (CI): `list` covers every fixture case, `issue` writes a bundle from the
committed fixtures (one case compared with golden files, environment lines masked), and
`check` says clearly what is missing. With torch and pnnx: the standalone model scripts are
the catalogue's models, `check` re-exports cases, and (slow) every generated
`test_<id>.py` runs and fails the way its issue says."""

from __future__ import annotations

import json
import os
import py_compile
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from golden import check_golden
from paramsurgery.cli import main
from paramsurgery.repro import cases as C
from paramsurgery.repro.catalogue import recorded
from paramsurgery.repro.issue import module_name, write_issue

ROOT = Path(__file__).resolve().parents[1]
REPROS = ROOT / "fixtures" / "repros"
GOLDEN_CASE = "dropped-negative-slice"
SECTIONS = ("## Environment", "## Minimal model", "## Expected vs observed",
            "## Generated graph", "## Why", "## Workaround", "## Related", "## Files")
_ENV_LINE = re.compile(r"^- (pnnx|ncnn|torch|Python|numpy|OS|paramsurgery): .*$", re.M)


def _mask_env(text: str) -> str:
    return _ENV_LINE.sub(lambda m: f"- {m.group(1)}: <masked>", text)


def _fixture_cases() -> list[str]:
    return sorted({p.parent.parent.name for p in REPROS.glob("*/*/status.json")})


def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paramsurgery", *argv], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                   **(env or {})})


def _export_tools() -> str | None:
    """Why the export tests cannot run here, or None when torch and pnnx are installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed (the export extra)"
    from paramsurgery.core.errors import MissingDependency
    from paramsurgery.repro.pnnx_export import find_pnnx

    try:
        find_pnnx()
    except MissingDependency as exc:
        return str(exc)
    return None


# --------------------------------------------------------------------------- list

def test_list_covers_every_fixture_case(capsys) -> None:  # noqa: ANN001
    assert main(["repro", "list", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["cases"]
    assert sorted(r["id"] for r in rows) == _fixture_cases() == sorted(C.case_ids())
    for r in rows:
        case = C.get_case(r["id"])
        assert r["recorded_from"] == "fixture"
        assert r["number"] == case.number and r["title"] == case.title
        assert r["construct"] == case.construct and r["upstream"] == list(case.upstream)
        for v in case.variants:
            assert r["recorded"][v.name] == recorded(case.id, v.name)["status"]
    assert main(["repro", "list"]) == 0
    text = capsys.readouterr().out
    for case in C.CASES:
        line = next(ln for ln in text.splitlines() if f" {case.id} " in ln)
        assert line.startswith(case.number)
        assert recorded(case.id, "bug")["status"] in line
        assert case.construct in text
    assert "none found (never reported)" in text      # cases with no upstream issue
    assert "pnnx/pnnx#228" in text and "Tencent/ncnn#6387" in text
    assert "21 cases; statuses recorded in fixtures/repros for 21" in text


# --------------------------------------------------------------------------- issue

def test_issue_golden(tmp_path: Path) -> None:
    out = tmp_path / "issue"
    assert main(["repro", "issue", GOLDEN_CASE, "-o", str(out), "--no-lint"]) == 0
    mod = module_name(GOLDEN_CASE)
    check_golden(f"repro/{GOLDEN_CASE}/ISSUE.md", _mask_env((out / "ISSUE.md").read_text()))
    # .golden: pytest must not collect the generated test as one of ours
    check_golden(f"repro/{GOLDEN_CASE}/{mod}.py.golden", (out / f"{mod}.py").read_text())
    check_golden(f"repro/{GOLDEN_CASE}/model.py.golden", (out / "model.py").read_text())
    for name in ("model.ncnn.param", "model.ncnn.bin", "model.pnnx.param", "model_ncnn.py"):
        assert (out / name).read_bytes() == (REPROS / GOLDEN_CASE / "bug" / name).read_bytes()


def test_issue_environment_lines_are_the_recorded_versions(tmp_path: Path) -> None:
    write_issue(GOLDEN_CASE, tmp_path, lint=False)
    env = dict(m.groups() for m in re.finditer(r"^- (\w+): (.*)$",
                                              (tmp_path / "ISSUE.md").read_text(), re.M)
               if m.group(1) in ("pnnx", "torch", "Python"))
    versions = recorded(GOLDEN_CASE, "bug")["versions"]
    assert env["pnnx"] == versions["pnnx"] and env["torch"] == versions["torch"]
    assert env["Python"] == versions["python"]


@pytest.mark.parametrize("case_id", C.case_ids())
def test_issue_bundle_for_every_case(case_id: str, tmp_path: Path) -> None:
    case = C.get_case(case_id)
    st = recorded(case_id, "bug")
    written = write_issue(case_id, tmp_path, lint=False)
    text = (tmp_path / "ISSUE.md").read_text()
    for section in SECTIONS:
        assert section in text, section
    assert case.title in text and case.why in text
    for line in st["offending_lines"]:
        assert line in text
    if st.get("pnnx"):
        assert "## Export" in text and " ".join(st["pnnx"]["command"]) in text
    for u in case.upstream:
        assert u in text
    test_py = tmp_path / f"{module_name(case_id)}.py"
    py_compile.compile(str(test_py), doraise=True)
    py_compile.compile(str(tmp_path / "model.py"), doraise=True)
    src = test_py.read_text()
    assert "def test():" in src and "torch.allclose" in src and "class Model(nn.Module)" in src
    if not case.handwritten:
        assert f"import {module_name(case_id)}_ncnn" in src and "os.system(" in src
    exported = {n for n in written if n.startswith("model") and n != "model.py"}
    if st["status"] == "export_fail":
        assert not exported
    else:
        assert "model.ncnn.param" in exported


def test_issue_overwrites_a_stale_bundle(tmp_path: Path) -> None:
    write_issue(GOLDEN_CASE, tmp_path, lint=False)
    write_issue("dead-conv-output", tmp_path, lint=False)      # pnnx wrote no files
    assert not (tmp_path / "model.ncnn.param").exists()
    assert "pass_level1" in (tmp_path / "ISSUE.md").read_text()


def test_issue_cites_lint_when_available(tmp_path: Path) -> None:
    write_issue("stack-sum-batch-axis", tmp_path)
    text = (tmp_path / "ISSUE.md").read_text()
    assert "`paramsurgery lint model.ncnn.param`:" in text
    assert re.search(r"model\.ncnn\.param:\d+: PS\d+ error .*Concat 'stack_0'", text)


def test_issue_unknown_case_exits_2(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["repro", "issue", "no-such-case", "-o", str(tmp_path)]) == 2
    assert "unknown repro case" in capsys.readouterr().err


def test_issue_accepts_case_numbers(tmp_path: Path) -> None:
    assert main(["repro", "issue", "3", "-o", str(tmp_path), "--no-lint"]) == 0
    assert (tmp_path / f"{module_name(GOLDEN_CASE)}.py").exists()


# --------------------------------------------------------------------------- check: missing tools

def test_check_says_torch_is_missing() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from paramsurgery.cli import main\n"
            "sys.exit(main(['repro', 'check', 'dropped-negative-slice']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                         "PARAMSURGERY_PNNX": "/nonexistent/pnnx"})
    assert proc.returncode == 2, proc.stderr
    assert "need the export extra" in proc.stderr
    assert "torch (pip install torch==2.13.0" in proc.stderr
    assert "the pnnx executable" in proc.stderr


def test_check_says_pnnx_is_missing() -> None:
    pytest.importorskip("torch")
    proc = _run("repro", "check", "dropped-negative-slice",
                env={"PARAMSURGERY_PNNX": "/nonexistent/pnnx"})
    assert proc.returncode == 2
    assert "missing: the pnnx executable" in proc.stderr and "torch (" not in proc.stderr


# --------------------------------------------------------------------------- with torch + pnnx

@pytest.fixture
def export_tools() -> None:
    reason = _export_tools()
    if reason:
        pytest.skip(f"repro check needs torch and pnnx: {reason}")


def test_scripts_are_the_catalogue_models() -> None:
    """The issue's standalone Model classes have the catalogue's weights and compute the
    catalogue's outputs (so the issue shows exactly the model that was measured)."""
    torch = pytest.importorskip("torch")
    from paramsurgery.repro import scripts as S

    for case in C.CASES:
        sc = S.script(case.id)
        for vname, src in (("bug", sc.model), ("workaround", sc.workaround)):
            v = case.variant(vname)
            ref = C.build_module(case, v)
            torch.manual_seed(case.seed)
            mine = S.build(src, sc.imports)().eval()
            a, b = ref.state_dict(), mine.state_dict()
            assert list(a) == list(b), (case.id, vname)
            assert all(torch.equal(a[k], b[k]) for k in a), (case.id, vname)
            inputs = C.case_inputs(case, v, case.lengths(v)[1])
            for x, y in zip(C.torch_reference(case, v, inputs, ref),
                            C.torch_reference(case, v, inputs, mine)):
                assert np.array_equal(x, y), (case.id, vname)


def test_check_two_cases(export_tools, tmp_path: Path) -> None:  # noqa: ANN001
    proc = _run("repro", "check", GOLDEN_CASE, "paramless-slice", "--keep", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(rf"3\s+{GOLDEN_CASE}\s+bug\s+wrong\s+wrong\s+still reproduces", out)
    assert re.search(r"2e\s+paramless-slice\s+bug\s+crash\s+crash\s+still reproduces", out)
    assert "ncnn killed by SIGSEGV" in out
    assert "shape ncnn [1, 4, 15] vs torch [1, 4, 12]" in out
    assert "all as recorded" in out
    assert (tmp_path / GOLDEN_CASE / "bug" / "model.ncnn.param").read_bytes() == \
        (REPROS / GOLDEN_CASE / "bug" / "model.ncnn.param").read_bytes()


def test_check_json_and_changed_status_exit_1(export_tools, tmp_path: Path,  # noqa: ANN001
                                              monkeypatch) -> None:  # noqa: ANN001
    """A status that differs from the recorded one makes `repro check` exit 1."""
    from paramsurgery.repro import observe

    real = observe.recorded

    def lying(case_id: str, variant: str):  # noqa: ANN202
        st = real(case_id, variant)
        if st is not None and variant == "bug":
            st = {**st, "status": "crash"}          # pretend the fixture recorded a crash
        return st

    monkeypatch.setattr(observe, "recorded", lying)
    assert main(["repro", "check", GOLDEN_CASE, "--format", "json"]) == 1


@pytest.mark.slow
def test_check_all_cases(export_tools) -> None:  # noqa: ANN001
    proc = _run("repro", "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("still reproduces") == len(C.CASES)


def _expected_outcome(st: dict) -> tuple[int, str]:
    """(exit code, text on stdout) of the generated test for a recorded status."""
    status = st["status"]
    if status == "crash":
        sig = {"SIGSEGV": 11, "SIGFPE": 8, "SIGABRT": 6}[st["signal_name"]]
        return -sig, ""
    if status == "export_fail":
        return 1, "FAIL: pnnx ended with signal"
    if status == "load_fail":
        return 1, "FAIL: ncnn load_param"
    return 1, "FAIL T="


@pytest.mark.slow
@pytest.mark.parametrize("case_id", C.case_ids())
def test_generated_test_fails_the_way_the_issue_says(case_id: str, tmp_path: Path,  # noqa: ANN001
                                                     export_tools) -> None:
    from paramsurgery.repro.pnnx_export import find_pnnx

    write_issue(case_id, tmp_path, lint=False)
    st = recorded(case_id, "bug")
    script = f"{module_name(case_id)}.py"
    proc = subprocess.run([sys.executable, script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PNNX": find_pnnx()})
    code, text = _expected_outcome(st)
    assert proc.returncode == code, proc.stdout + proc.stderr[-2000:]
    assert text in proc.stdout
    if st["status"] == "wrong" and not C.get_case(case_id).variant("bug").nondeterministic:
        # the untraced length is where the issue says it goes wrong
        assert re.search(r"FAIL T=\d+ \(untraced\)", proc.stdout)
    issue = (tmp_path / "ISSUE.md").read_text()
    assert f"with pnnx {st['versions']['pnnx']} it " in issue


@pytest.mark.slow
@pytest.mark.parametrize("case_id", [c.id for c in C.CASES if not c.handwritten])
def test_model_script_exports_the_recorded_graph(case_id: str, tmp_path: Path,  # noqa: ANN001
                                                 export_tools) -> None:
    """`python model.py [workaround]` in the bundle writes the graphs of the fixtures."""
    from paramsurgery.repro.pnnx_export import find_pnnx

    write_issue(case_id, tmp_path, lint=False)
    for variant in ("bug", "workaround"):
        for name in ("model.ncnn.param", "model.ncnn.bin"):
            (tmp_path / name).unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "model.py", variant], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PNNX": find_pnnx()})
        fixture = REPROS / case_id / variant
        if recorded(case_id, variant)["status"] == "export_fail":
            assert proc.returncode != 0
            continue
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (tmp_path / "model.ncnn.param").read_bytes() == \
            (fixture / "model.ncnn.param").read_bytes(), variant
        assert (tmp_path / "model.ncnn.bin").read_bytes() == \
            (fixture / "model.ncnn.bin").read_bytes(), variant
