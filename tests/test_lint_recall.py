"""Recall: every bug case in fixtures/repros and every known problem of the raw Qwen3-TTS
fixtures is reported, with the right code (a table: case → expected codes).

The repro graphs are linted as a user would (`lint_file`: pnnx's `model.pnnx.param`,
`model_ncnn.py` and `ref.npz` next to the file are discovered), conformance runs included
(a few child processes per case, ~1 s)."""

import json
import re

import pytest

from paramsurgery.core.findings import ERROR
from paramsurgery.repro.cases import case_ids, get_case, offending_lines

from test_lint_support import (FIXTURES, REPROS, codes, export_id, lint_export, lint_repro,
                               qwen_exports)

# case/variant -> (codes that must be reported, codes that must be errors)
REPRO_EXPECTED = {
    ("repeat-kv-expand", "bug"): ({"PS004"}, {"PS004"}),
    ("unbind-batch-axis", "bug"): ({"PS004", "PS008"}, {"PS004"}),
    ("slice-batch-axis", "bug"): ({"PS003", "PS404"}, {"PS003"}),
    ("fused-qkv-unbind", "bug"): ({"PS004", "PS008"}, {"PS004"}),
    ("uneven-chunk", "bug"): ({"PS402", "PS403", "PS411"}, {"PS402", "PS403"}),
    ("paramless-slice", "bug"): ({"PS001", "PS404"}, {"PS001", "PS404"}),
    ("dropped-negative-slice", "bug"): ({"PS403"}, {"PS403"}),
    ("stack-sum-batch-axis", "bug"): ({"PS003", "PS006", "PS404"}, {"PS003", "PS006", "PS404"}),
    ("causal-pad-from-shape", "bug"): ({"PS004", "PS410"}, {"PS004"}),
    ("causal-pad-from-shape", "static"): ({"PS403"}, {"PS403"}),
    ("rope-4d-no-batch", "bug"): ({"PS010", "PS405"}, {"PS405"}),
    ("int-arith-before-embed", "bug"): ({"PS007"}, {"PS007"}),
    ("sdpa-is-causal", "bug"): ({"PS004"}, {"PS004"}),
    ("axis-into-batch", "bug"): ({"PS008", "PS403"}, {"PS403"}),
    ("size-after-transpose-folded", "bug"): ({"PS016"}, {"PS016"}),
    ("one-d-through-batch-axis", "bug"): ({"PS404"}, {"PS404"}),
    ("bool-mask-buffer", "bug"): ({"PS020", "PS004"}, {"PS020", "PS004"}),
    ("ones-padding-mask", "bug"): ({"PS004"}, {"PS004"}),
    # a static export's folded table: right at its traced length; lint holds a reference at
    # another length by its shapes, and these shapes are right (LINT_BLIND below)
    ("folded-position-table", "bug"): (set(), set()),
    ("folded-position-table", "slice"): (set(), set()),
    ("folded-position-table", "dynamic"): ({"PS004"}, {"PS004"}),
    ("folded-interpolated-table", "bug"): ({"PS403"}, {"PS403"}),
    ("tied-linear", "bug"): ({"PS017", "PS403"}, {"PS017", "PS403"}),
}
# pnnx itself crashed: there is no graph to lint (pnnx-bugs.md case 6d)
NO_GRAPH = {("dead-conv-output", "bug")}

# bugs only a reference run sees: the finding names the wrong output, not the layer
OUTPUT_ONLY = {
    ("causal-pad-from-shape", "static"): "a static export is right at its traced shape; only "
    "the reference run at another length shows the output is short (PS403 names out0; the "
    "frozen Padding is the layer before it)",
    ("folded-interpolated-table", "bug"): "the folded grid is right at the traced size; only "
    "the reference at 20x20 shows the output is short (PS403 names out0: 9 patches, not 25)",
}

# bugs lint does not see: the values are wrong, every shape right (lint compares a reference's
# shapes, not its values; `fix --verify` / `compare` see the values)
LINT_BLIND = {
    ("folded-position-table", "bug"): "a static export's folded 7 rows added to 9: ncnn "
    "broadcasts them without an error, the output shape is torch's, its values are not",
    ("folded-position-table", "slice"): "the same fold as the bug variant (weight[:T])",
}

# the torch construct each PS004 finding must name
CONSTRUCT_WORDS = {
    "repeat-kv-expand": "repeat_kv",
    "unbind-batch-axis": "batch axis",
    "fused-qkv-unbind": "fused qkv",
    "causal-pad-from-shape": "math.ceil",
    "sdpa-is-causal": "is_causal=True",
}


def repro_variants():
    out = []
    for d in sorted(REPROS.iterdir()):
        if d.is_dir():
            for v in sorted(d.iterdir()):
                if v.is_dir():
                    out.append((d.name, v.name))
    return out


def test_the_table_covers_every_bug_variant():
    bugs = {(c, v) for c, v in repro_variants() if v != "workaround"}
    assert bugs == set(REPRO_EXPECTED) | NO_GRAPH
    assert {c for c, _ in bugs} == set(case_ids())
    for c, v in NO_GRAPH:
        assert not (REPROS / c / v / "model.ncnn.param").exists()


@pytest.mark.parametrize("case,variant", sorted(REPRO_EXPECTED))
def test_repro_bug_is_reported_with_the_right_code(case, variant):
    fs = lint_repro(case, variant)
    must, errors = REPRO_EXPECTED[(case, variant)]
    assert must <= codes(fs), [f.format() for f in fs]
    assert errors <= codes(fs, ERROR), [f.format() for f in fs]
    # and nothing unexpected at error level
    assert codes(fs, ERROR) <= must, [f.format() for f in fs]
    status = json.loads((REPROS / case / variant / "status.json").read_text())
    assert status["status"] != "right"


@pytest.mark.parametrize("case,variant", sorted(REPRO_EXPECTED))
def test_findings_point_at_the_offending_lines(case, variant):
    """Where the catalogue names offending .ncnn.param lines, a finding sits on one of them
    (for case 7 the Reshape gets the PS008 warning and the wrong output the PS403 error)."""
    param = REPROS / case / variant / "model.ncnn.param"
    text = param.read_text()
    bad = set(offending_lines(get_case(case), text))
    if not bad:
        pytest.skip("the catalogue names no offending line (the bug is a missing layer)")
    lines = {i + 1 for i, ln in enumerate(text.splitlines())
             if re.sub(r"\s+", " ", ln.strip()) in bad}
    if (case, variant) in OUTPUT_ONLY:
        pytest.skip(OUTPUT_ONLY[(case, variant)])
    if (case, variant) in LINT_BLIND:
        pytest.skip(LINT_BLIND[(case, variant)])
    fs = lint_repro(case, variant)
    assert any(f.line in lines for f in fs), (sorted(lines), [f.format() for f in fs])
    assert codes(fs, ERROR)


@pytest.mark.parametrize("case", sorted(CONSTRUCT_WORDS))
def test_leftover_findings_name_the_torch_construct(case):
    fs = [f for f in lint_repro(case, "bug") if f.code == "PS004"]
    assert fs and all(CONSTRUCT_WORDS[case] in f.message for f in fs), \
        [f.message for f in fs]
    if case == "repeat-kv-expand":
        assert all(f.fix == "paramsurgery fold-gqa" for f in fs)


@pytest.mark.parametrize("case,layer", [("one-d-through-batch-axis", "slice_0_ncnnreshape"),
                                        ("paramless-slice", "unbind_0")])
def test_run_failure_names_the_layer_that_fails(case, layer):
    """PS404 (ncnn fails when the graph runs) names the first layer whose outputs cannot be
    computed, found by bisecting the layers (extract the tops of the first k): the Reshape
    ncnn rejects at run time (extract returns -1), the Slice without slices (SIGSEGV)."""
    fs = [f for f in lint_repro(case, "bug") if f.code == "PS404"]
    assert fs and all(f.layer == layer for f in fs), [f.format() for f in fs]
    assert all("the first layer that fails is " in f.message and repr(layer) in f.message
               for f in fs)


def test_repros_findings_are_exact_where_the_message_gives_numbers():
    fs = lint_repro("uneven-chunk", "bug")
    split = next(f for f in fs if f.code == "PS402")
    assert "splits length 9 as 4+5; torch's chunk gives 5+4" in split.message
    fs = lint_repro("dropped-negative-slice", "bug")
    ref = next(f for f in fs if f.code == "PS403")
    assert "has ncnn shape (4,15) but torch gives (1,4,12)" in ref.message
    fs = lint_repro("causal-pad-from-shape", "static")
    ref = next(f for f in fs if f.code == "PS403")
    assert "has ncnn shape (4,6) but torch gives (1,4,7)" in ref.message
    fs = lint_repro("causal-pad-from-shape", "bug")
    frozen = next(f for f in fs if f.code == "PS410")
    assert frozen.file.endswith("model.pnnx.param") and "(1,4,12)" in frozen.message


def test_uneven_chunk_is_found_by_the_probe_run_alone(tmp_path):
    """Without a reference, the probe run (traced length + 1) exposes the uneven split."""
    import shutil

    from paramsurgery.lint import lint_file

    src = REPROS / "uneven-chunk" / "bug"
    for name in ("model.ncnn.param", "model.ncnn.bin", "model.pnnx.param", "model_ncnn.py"):
        shutil.copy(src / name, tmp_path / name)
    fs = lint_file(tmp_path / "model.ncnn.param")
    split = [f for f in fs if f.code == "PS402"]
    assert split and "splits length 11 as 5+6" in split[0].message
    assert "PS403" not in codes(fs)


# =========================================================================== Qwen3-TTS raw

# every raw export (tiny and real) -> (codes that must be reported, error codes allowed)
RAW_EXPECTED = {
    "talker_decoder": ({"PS004"}, {"PS004"}),      # M-RoPE slicing + repeat_kv leftovers
    "predictor_decoder": ({"PS004"}, {"PS004"}),   # repeat_kv leftovers
    "speaker_encoder": ({"PS004"}, {"PS004"}),     # ECAPA length mask, repeat, masked_fill
    # (+ PS016 on the tiny export, whose pnnx script records the length pnnx froze)
    "mimi_encoder": ({"PS004", "PS008", "PS015"}, {"PS004", "PS015"}),  # pads, batch n, lost positions
    "talker_text_embed": (set(), set()),            # runs right
    "talker_codec_embed": (set(), set()),
    "talker_codec_head": (set(), set()),
    "predictor_embeds": (set(), set()),
    "predictor_heads": (set(), set()),
}


TINY_PNNX_SCRIPTS = FIXTURES / "qwen3_tts" / "tiny"


def raw_ids():
    return [export_id(e) for e in qwen_exports(variant="raw")]


def test_raw_table_covers_every_raw_export():
    mods = {e["module"] for e in qwen_exports(variant="raw")}
    assert mods == set(RAW_EXPECTED)
    # codec_decoder raw: pnnx aborted, no graph (recorded in the manifest)
    failed = [e for e in json.loads((FIXTURES / "manifest.json").read_text())
              ["qwen3_tts"]["exports"] if e["module"] == "codec_decoder" and e["variant"] == "raw"]
    assert failed and all(e["status"]["kind"] == "pnnx_failed" for e in failed)


FROZEN_TRACE_LENGTH = ("speaker_encoder",)  # ECAPA's mask length and mean divisor


@pytest.mark.parametrize("key", raw_ids())
def test_raw_qwen_problems_are_reported(key):
    e = next(x for x in qwen_exports() if export_id(x) == key)
    fs = lint_export(key, False)
    must, errors = RAW_EXPECTED[e["module"]]
    # a length pnnx froze at the first trace: lint needs pnnx's script (kept for tiny)
    if e["module"] in FROZEN_TRACE_LENGTH and key.startswith("tiny/"):
        assert (TINY_PNNX_SCRIPTS / f"{e['module']}.raw_ncnn.py").exists()
        must, errors = must | {"PS016"}, errors | {"PS016"}
    assert must <= codes(fs), [f.format() for f in fs][:5]
    assert codes(fs, ERROR) == errors
    # the status the manifest recorded agrees with the lint's verdict
    assert (e["status"]["kind"] == "load_fails") == bool(codes(fs, ERROR))


def test_raw_leftovers_name_their_constructs_and_fixes():
    for size in ("tiny", "real"):
        fs = lint_export(f"{size}/talker_decoder.raw", False)
        by_type = {}
        for f in fs:
            if f.code == "PS004":
                t = f.message.split()[0]
                by_type.setdefault(t, set()).add(f.fix)
                assert "M-RoPE" in f.message or "repeat_kv" in f.message, f.message
        assert set(by_type) == {"Tensor.slice", "Tensor.slice_copy", "pnnx.Expression",
                                "Tensor.expand"}
        assert by_type["Tensor.expand"] == {"paramsurgery fold-gqa"}
        fs = lint_export(f"{size}/predictor_decoder.raw", False)
        assert {f.fix for f in fs if f.code == "PS004"} == {"paramsurgery fold-gqa"}
        fs = lint_export(f"{size}/mimi_encoder.raw", False)
        msgs = " ".join(f.message for f in fs if f.code == "PS004")
        assert "math.ceil" in msgs and "replicate" in msgs


def test_the_wrong_level_sum_is_caught_by_the_run():
    """codec_decoder `ported_levelsum_port_matmul` (recorded `wrong`): the 15 levels are put
    into ncnn's batch n; the run with pnnx's batch axes shows it as errors."""
    fs = lint_export("tiny/codec_decoder.ported_levelsum_port_matmul", True)
    assert {"PS008", "PS401", "PS403"} <= codes(fs)
    ref = next(f for f in fs if f.code == "PS403")
    assert ref.severity == ERROR and "ncnn shape (15,1,24960) but torch gives (1,1,24960)" in ref.message
    trace = next(f for f in fs if f.code == "PS401")
    assert "(15,48,25)" in trace.message and "(1,48,?)" in trace.message
