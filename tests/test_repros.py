"""The committed pnnx-bug repros (fixtures/repros/<case>/<variant>/) still behave in ncnn
as recorded, and the catalogue in paramsurgery.repro.cases matches the fixture tree.

Runs without torch: every graph is loaded from the committed files and fed the committed
inputs in a child process (several of them crash ncnn on purpose). The slow tests at the end
re-export with torch + pnnx and need the export extra."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paramsurgery.repro import cases as C
from paramsurgery.repro.check import classify, load_reference, run_reference
from paramsurgery.runtime.child import NO_BATCH, RunResult

ROOT = Path(__file__).resolve().parents[1]
REPROS = ROOT / "fixtures" / "repros"
MODEL_FILES = ("model.ncnn.param", "model.ncnn.bin", "model.pnnx.param")


def _fixture_dirs() -> list[tuple[str, str]]:
    return sorted((p.parent.parent.name, p.parent.name) for p in REPROS.glob("*/*/status.json"))


def _catalogue() -> list[tuple[str, str]]:
    return sorted((c.id, v.name) for c in C.CASES for v in c.variants)


def _status(case_id: str, variant: str) -> dict:
    return json.loads((REPROS / case_id / variant / "status.json").read_text())


ALL = _catalogue()


# --------------------------------------------------------------------------- catalogue

def test_catalogue_and_fixture_tree_agree() -> None:
    assert _fixture_dirs(), f"no repro fixtures under {REPROS}"
    assert _fixture_dirs() == ALL
    # no stray case directories without a status.json either
    on_disk = sorted((v.parent.name, v.name) for v in REPROS.glob("*/*") if v.is_dir())
    assert on_disk == ALL


def test_catalogue_is_well_formed() -> None:
    ids = C.case_ids()
    assert len(ids) == len(set(ids))
    numbers = [c.number for c in C.CASES]
    assert len(numbers) == len(set(numbers))
    # every case of pnnx-bugs.md §1/§2 is covered, and the ones found repairing the raw
    # Qwen3-TTS exports (8: speaker encoder's folded length, 9: 1-D tensors through n), and
    # the zoo's GPT-2 eager export (10: a bool constant's load type) and BERT's dynamic export
    # (11: the default all-ones padding mask built in the graph), and the upstream causes of the
    # zoo's refused cells: static exports folding a learned position table (12: GPT-2, BERT,
    # Whisper) or an interpolated grid (13: ViT), and the tied lm_head (14: GPT-2, Gemma)
    assert set(numbers) == {"1", "2a", "2b", "2c", "2d", "2e", "3", "4", "5",
                            "6a", "6b", "6c", "6d", "7", "8", "9", "10", "11",
                            "12", "13", "14"}
    for case in C.CASES:
        names = [v.name for v in case.variants]
        assert names[0] == "bug" and "workaround" in names, case.id
        assert case.variant("workaround").expected == "right", case.id
        assert case.variant("bug").expected != "right", case.id
        assert case.why and case.construct and case.title and case.offending_text
        assert len(case.input_names) == len(C.raw_inputs(case, case.run_length))
        for v in case.variants:
            traces, run_len = case.lengths(v)
            # dynamic variants are run at a length no trace used
            if len(traces) > 1:
                assert run_len not in traces, (case.id, v.name)


def test_cases_import_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import paramsurgery.repro.cases as c, paramsurgery.repro.check\n"
            "import paramsurgery.repro.pnnx_export\n"
            "print(len(c.CASES))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == len(C.CASES)


def test_inputs_are_deterministic() -> None:
    for case in C.CASES:
        a = C.raw_inputs(case, case.run_length)
        b = C.raw_inputs(case, case.run_length)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


# --------------------------------------------------------------------------- fixtures

@pytest.mark.parametrize(("case_id", "variant"), ALL, ids=[f"{c}/{v}" for c, v in ALL])
def test_fixture_files_consistent(case_id: str, variant: str) -> None:
    case = C.get_case(case_id)
    var = case.variant(variant)
    st = _status(case_id, variant)
    vdir = REPROS / case_id / variant
    assert st["case"] == case_id and st["variant"] == variant
    assert st["status"] in C.STATUSES
    assert st["expected_status"] == var.expected
    assert st["matches_catalogue"] == (st["status"] == var.expected)
    traces, run_len = case.lengths(var)
    assert st["trace_lengths"] == list(traces) and st["run_length"] == run_len

    ref = load_reference(vdir / "ref.npz")
    # the committed inputs are what the catalogue generates (host preprocessing included)
    expected_inputs = C.case_inputs(case, var, run_len)
    assert len(ref.inputs) == len(expected_inputs)
    for got, want in zip(ref.inputs, expected_inputs):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert {k: list(v) for k, v in st["input_shapes"].items()} == \
        {f"in{i}": list(a.shape) for i, a in enumerate(ref.inputs)}

    if st["status"] == "export_fail":
        for name in MODEL_FILES:
            assert not (vdir / name).exists(), name
        assert st["pnnx"]["returncode"] != 0
        assert st["pnnx"]["stderr_tail"]
        return

    text = (vdir / "model.ncnn.param").read_text()
    assert text.startswith("7767517\n")
    # the recorded evidence is what the catalogue's patterns find in the committed graph
    assert st["offending_lines"] == C.offending_lines(case, text)
    if var.expected != "right" and case.offending:
        assert st["offending_lines"], "a broken graph must show its offending lines"
    if var.handwritten_param is not None:
        assert text == var.handwritten_param
        assert st["handwritten"] is True and "hand-written" in st["notes"]
    else:
        assert (vdir / "model.pnnx.param").exists()
        assert st["pnnx"]["returncode"] == 0
    py = vdir / "model_ncnn.py"
    if py.exists():
        from paramsurgery.repro.pnnx_export import parse_ncnn_py

        assert parse_ncnn_py(py.read_text()) == (ref.input_batch_index, ref.output_batch_index)
    # every Input/output blob has the batch axis pnnx chose
    assert set(ref.input_batch_index) == {f"in{i}" for i in range(len(ref.inputs))}
    assert st["input_batch_index"] == ref.input_batch_index
    assert st["output_batch_index"] == ref.output_batch_index


@pytest.mark.parametrize(("case_id", "variant"), ALL, ids=[f"{c}/{v}" for c, v in ALL])
def test_recorded_status_is_what_ncnn_does(case_id: str, variant: str) -> None:
    """Load the committed graph in a child process, feed ref.npz, compare with the stored
    torch outputs: the outcome must be the recorded one (crash with the same signal, the
    same load failure, the same wrong shapes or error, or right)."""
    st = _status(case_id, variant)
    if st["status"] == "export_fail":
        pytest.skip("pnnx wrote no graph (checked in test_fixture_files_consistent)")
    vdir = REPROS / case_id / variant
    ref = load_reference(vdir / "ref.npz")
    run = run_reference(vdir / "model.ncnn.param", vdir / "model.ncnn.bin", ref, timeout=120)
    now = classify(run, ref.outputs, C.get_case(case_id).variant(variant).nondeterministic)

    assert now["status"] == st["status"], (now, run.describe())
    assert now["ncnn_status"] == st["ncnn_status"]
    if st["status"] == "crash":
        assert now["signal"] == st["signal"]
    elif st["status"] == "load_fail":
        assert now["ncnn_stderr"] == st["ncnn_stderr"]
    elif st["status"] == "right":
        assert now["max_abs_err"] is not None and now["max_abs_err"] <= C.ATOL
    else:  # wrong
        assert now["output_shapes"] == st["output_shapes"]
        if st.get("max_abs_err") is not None:
            rec, cur = st["max_abs_err"], now["max_abs_err"]
            assert cur is not None
            assert math.isclose(float(cur), float(rec), rel_tol=1e-2)


# --------------------------------------------------------------------------- verdict logic

def test_compare_outputs_verdicts() -> None:
    ref = [np.arange(12, dtype=np.float32).reshape(1, 3, 4)]
    assert C.compare_outputs([ref[0].reshape(3, 4)], ref).status == "right"  # unit axis dropped
    assert C.compare_outputs([ref[0] + 5e-4], ref).status == "right"
    bad = C.compare_outputs([ref[0] + 0.1], ref)
    assert bad.status == "wrong" and bad.max_abs == pytest.approx(0.1, rel=1e-4)
    shape = C.compare_outputs([np.zeros((3, 5), np.float32)], ref)
    assert shape.status == "wrong" and shape.max_abs is None
    assert C.compare_outputs([np.zeros((0,), np.float32)], ref).status == "wrong"  # empty Mat
    assert C.compare_outputs([ref[0].reshape(4, 3)], ref).status == "wrong"       # transposed
    nan = ref[0].copy()
    nan[0, 0, 0] = np.nan
    assert C.compare_outputs([nan], ref).status == "wrong"
    assert C.compare_outputs([], ref).status == "wrong"


def test_classify_maps_runtime_outcomes() -> None:
    ref = [np.ones((2, 2), np.float32)]
    assert classify(RunResult("crash", signal=signal.SIGSEGV), ref)["status"] == "crash"
    assert classify(RunResult("load_param_failed"), ref)["status"] == "load_fail"
    assert classify(RunResult("ok", {"out0": ref[0]}), ref)["status"] == "right"
    assert classify(RunResult("ok", {"out0": ref[0] * 2}), ref)["status"] == "wrong"
    assert classify(RunResult("extract_failed"), ref)["status"] == "wrong"


def test_paramless_slice_twin_differs_only_in_slice_params() -> None:
    bug = C.PARAMLESS_SLICE_PARAM.splitlines()
    fixed = C.FIXED_SLICE_PARAM.splitlines()
    diff = [(a, b) for a, b in zip(bug, fixed) if a != b]
    assert len(bug) == len(fixed) and len(diff) == 1
    assert diff[0][0].split()[0] == "Slice"
    assert diff[0][1].endswith("-23300=3,-233,-233,-233 1=0")


def test_no_batch_constant() -> None:
    assert C.NO_BATCH == NO_BATCH == 233


# --------------------------------------------------------------------------- slow: re-export

SLOW_CASES = ["dropped-negative-slice", "stack-sum-batch-axis"]


@pytest.mark.slow
@pytest.mark.parametrize("case_id", SLOW_CASES)
def test_reexport_reproduces_recorded_status(case_id: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from paramsurgery.core.errors import MissingDependency
    from paramsurgery.repro.pnnx_export import find_pnnx

    try:
        find_pnnx()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import fixtures_repros
    finally:
        sys.path.remove(str(ROOT / "tools"))

    fixtures_repros.build(tmp_path, only=[case_id])
    case = C.get_case(case_id)
    for v in case.variants:
        new = json.loads((tmp_path / case_id / v.name / "status.json").read_text())
        old = _status(case_id, v.name)
        assert new["status"] == old["status"], (v.name, new, old)
        same_tools = new["versions"] == old["versions"]
        new.pop("versions"), old.pop("versions")
        if same_tools:  # with the recorded pnnx/torch the rebuild is byte-identical
            assert new == old
            for name in ("model.ncnn.param", "model.ncnn.bin", "ref.npz"):
                committed = REPROS / case_id / v.name / name
                rebuilt = tmp_path / case_id / v.name / name
                assert rebuilt.read_bytes() == committed.read_bytes(), name
