"""Precision: lint never cries wolf. No error-level finding on any third-party ncnn corpus
file (except custom_layer.param, which ncnn itself rejects), any `ported` Qwen3-TTS fixture
(tiny: with the conformance run at the traced shapes and against the torch reference; real:
static rules) or any repro workaround (with runs). Every warning that does appear is listed
here with the reason it is right to report it."""

import pytest

from paramsurgery.core.findings import ERROR, WARNING
from paramsurgery.lint import lint_file

from conftest import corpus_params
from test_lint_support import REPROS, codes, export_id, lint_export, lint_repro, qwen_exports

# file -> {code: why the warning is right}
CORPUS_WARNINGS = {
    "nanodet_m.param": {"PS101": "the header declares 179 layers but the file has 180: ncnn "
                                 "silently drops the last layer ('Output')"},
    "mobilenetv2_yolov3.param": {"PS011": "Yolov3DetectionOutput's float array 5 (mask) is "
                                          "written as int32 bit patterns of floats"},
    "yolo-fastest-1.1.param": {"PS011": "same: float array written as int bit patterns"},
    "yolov4-tiny.param": {"PS011": "same: float array written as int bit patterns"},
}
CORPUS_ERRORS = {"custom_layer.param": {"PS005"}}  # ncnn: "layer CustomLayer not exists"

# ported export (size-independent key) -> {code: why}
# (talker_text_embed.ported gets PS008 as an info: its T rows go into ncnn's batch n, only
# per-row InnerProducts follow, and out0 must be read with batch_index=0)
PORTED_WARNINGS: dict[str, dict[str, str]] = {}


@pytest.mark.parametrize("path", corpus_params(), ids=lambda p: p.name)
def test_corpus_has_no_false_errors(path):
    fs = lint_file(path)
    assert codes(fs, ERROR) == CORPUS_ERRORS.get(path.name, set()), [f.format() for f in fs]
    assert codes(fs, WARNING) == set(CORPUS_WARNINGS.get(path.name, {})), \
        [f.format() for f in fs if f.severity == WARNING]


def test_custom_layer_is_what_ncnn_rejects():
    from conftest import CORPUS, ncnn_loads

    assert ncnn_loads((CORPUS / "custom_layer.param").read_text()) != 0


def ported_ids(size):
    return [export_id(e) for e in qwen_exports(size, "ported")]


def _check_ported(key, fs):
    name = key.split("/", 1)[1]
    assert codes(fs, ERROR) == set(), [f.format() for f in fs if f.severity == ERROR]
    assert codes(fs, WARNING) == set(PORTED_WARNINGS.get(name, {})), \
        [f.format() for f in fs if f.severity == WARNING]


@pytest.mark.parametrize("key", ported_ids("tiny"))
def test_tiny_ported_fixtures_conform_when_run(key):
    fs = lint_export(key, True)
    _check_ported(key, fs)
    assert "PS400" not in codes(fs), [f.format() for f in fs]  # the runs really happened


@pytest.mark.parametrize("key", ported_ids("real"))
def test_real_ported_fixtures_have_no_false_errors(key):
    _check_ported(key, lint_export(key, False))


@pytest.mark.parametrize("case", sorted(d.name for d in REPROS.iterdir()
                                        if (d / "workaround" / "model.ncnn.param").exists()))
def test_repro_workarounds_are_clean(case):
    fs = lint_repro(case, "workaround")
    assert codes(fs, ERROR) == set() and codes(fs, WARNING) == set(), [f.format() for f in fs]
    assert "PS400" not in codes(fs), [f.format() for f in fs]


@pytest.mark.slow
def test_runs_right_exports_of_other_variants_have_no_errors():
    """`raw`/`unfused`/level-sum exports that ncnn runs right: no error either."""
    for e in qwen_exports("tiny"):
        if e["variant"] == "ported" or e["status"]["kind"] != "runs_right":
            continue
        fs = lint_export(export_id(e), True)
        assert codes(fs, ERROR) == set(), (export_id(e), [f.format() for f in fs])
