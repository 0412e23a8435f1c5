"""User-written rewrite rules (patterns/rule_file.py, patterns/pattern.py, passes/rewrite.py)
and the fold-constant-layout pass: parsing errors located, matching through Splits and
commuted operands, near-misses, refusals, and numbers through ncnn. The command-level
behaviours (golden outputs, exit codes) are the case files in tests/cases/."""

from __future__ import annotations

import pytest

import paramsurgery
from paramsurgery.core.errors import ParamSyntaxError, PassRefused
from paramsurgery.core.match import MatchStatus
from paramsurgery.passes.fold_constant_layout import FoldConstantLayout
from paramsurgery.passes.rewrite import Rewrite
from paramsurgery.patterns.pattern import find_matches
from paramsurgery.patterns.rule_file import parse_rule, read_rule_file
from paramsurgery.verify.equivalence import verify_equivalent

from conftest import FIXTURES

RW = FIXTURES / "rewrite"
FOLD = FIXTURES / "fold_constants"


@pytest.mark.parametrize("text, line, fragment", [
    ("Reshape r 1 1 %x %y\n", 1, "a rule starts with a 'pattern' line"),
    ("pattern\nReshape r 1 1 %x %y\n", 1, "no 'replacement' section"),
    ("pattern\nReshap r 1 1 %x %y\nreplacement\n", 2, "'Reshap' is not an ncnn layer type"),
    ("pattern\nReshape r 1 2 %x %y\nreplacement\n", 2, "1 bottom(s) and 2 top(s) declared"),
    ("pattern\nReshape r 1 1 x %y\nreplacement\nReLU r 1 1 %x %y\n", 2, "must be a capture (%x)"),
    ("pattern\nReshape r 1 1 %x %y 0=1,x\nreplacement\nReLU r 1 1 %x %y\n", 2, "0=1,x"),
    ("pattern\nReshape r 1 1 %x %y\nreplacement\nReLU q 1 1 %x z\n", 4, "does not write '%y'"),
    ("pattern\nReshape r 1 1 %x %y\nreplacement\nReLU q 1 1 %w %y\n", 4, "'%w' is not a capture"),
    ("pattern\nReshape r 1 1 %x %y\nreplacement\nReLU %q 1 1 %x %y\n", 4, "no pattern layer is labelled 'q'"),
    ("pattern\nReshape r 1 1 %x %y\nreplacement\nReLU q 1 1 %x %y\nwhere\nimport os\n", 6, "condition"),
    ("pattern\nReshape r 1 1 %x %y\nreplacement\nReLU q 1 1 %x %y\nwhere\nopen(r[0])\n", 6, "only abs() and len()"),
    ("pattern\nReshape r 1 1 %x %y\nreplacement\nReLU q 1 1 %x %y\nwhere\nq[0] == 1\n", 6, "'q' is not a pattern label"),
])
def test_bad_rules_are_located(text, line, fragment):
    with pytest.raises(ParamSyntaxError) as exc:
        parse_rule(text, "r.rule")
    assert exc.value.line == line and fragment in str(exc.value), str(exc.value)
    assert str(exc.value).startswith(f"r.rule:{line}:")


def test_an_unreadable_rule_file_is_located(tmp_path):
    with pytest.raises(ParamSyntaxError, match="cannot read the rule file"):
        read_rule_file(tmp_path / "missing.rule")


MUL_ADD = """7767517
5 6
Input in0 0 1 in0
Split sp 1 2 in0 a b
BinaryOp m 2 1 a b sq 0=2
BinaryOp k 1 1 sq t 0=0 1=1 2=1.0
ReLU r 1 1 t out0
"""
SQUARE_PLUS_ONE = """pattern
BinaryOp  m  2 1 %x %x sq  0=2
BinaryOp  k  1 1 sq %y     0=0 1=1 2=1.0
replacement
UnaryOp   u  1 1 %x s      0=4
BinaryOp  %k 1 1 s %y      0=0 1=1 2=1.0
"""


def test_a_value_read_twice_through_a_split_is_one_capture():
    g = paramsurgery.loads(MUL_ADD)
    matches, near = find_matches(g, parse_rule(SQUARE_PLUS_ONE))
    assert near is None and len(matches) == 1
    assert matches[0].blobs["%x"] == "in0"  # above the Split


def test_an_internal_blob_read_outside_is_a_check_failure():
    text = MUL_ADD.replace("5 6", "6 7").replace("ReLU r 1 1 t out0", "ReLU r 1 1 t out0\nReLU s 1 1 sq2 out1") \
        .replace("BinaryOp m 2 1 a b sq 0=2", "BinaryOp m 2 1 a b sq0 0=2\nSplit sp2 1 2 sq0 sq sq2") \
        .replace("6 7", "7 9")
    g = paramsurgery.loads(text)
    matches, near = find_matches(g, parse_rule(SQUARE_PLUS_ONE))
    assert matches == [] and near is not None
    assert near.status is MatchStatus.CHECK_FAILED and "capture it as %sq" in near.reason


def test_commuted_operands_match():
    rule = parse_rule("""pattern
BinaryOp  h  1 1 %x f   0=2 1=1 2=0.5
BinaryOp  m  2 1 f %z %y 0=2
replacement
BinaryOp  a  2 1 %x %z p 0=2
BinaryOp  %m 1 1 p %y   0=2 1=1 2=0.5
""")
    g = paramsurgery.loads("""7767517
5 5
Input in0 0 1 in0
Input in1 0 1 in1
BinaryOp h 1 1 in0 f 0=2 1=1 2=0.5
BinaryOp m 2 1 in1 f y 0=2
ReLU r 1 1 y out0
""")
    res = Rewrite(rules=[rule])(g)
    assert res.modified and [layer.type for layer in res.graph] == ["Input", "Input", "BinaryOp", "BinaryOp", "ReLU"]
    check = _prove(res.graph, g, {"in0": ("T", 8), "in1": ("T", 8)})
    assert check.ok, check.format()


def test_a_false_condition_is_the_near_miss():
    rule = parse_rule(SQUARE_PLUS_ONE + "where\nk[2] > 2\n")
    res = Rewrite(rules=[rule])(paramsurgery.loads(MUL_ADD))
    assert not res.modified
    assert "condition 'k[2] > 2' is false" in res.skipped[0].reason


def test_a_replacement_that_needs_weights_is_refused():
    rule = parse_rule(SQUARE_PLUS_ONE.replace("UnaryOp   u  1 1 %x s      0=4",
                                              "InnerProduct u 1 1 %x s 0=4 1=0 2=32"))
    with pytest.raises(PassRefused, match="would read weights"):
        Rewrite(rules=[rule])(paramsurgery.loads(MUL_ADD))


def test_the_square_rule_is_right_through_ncnn(tmp_path):
    g = paramsurgery.loads(MUL_ADD)
    res = Rewrite(rules=[parse_rule(SQUARE_PLUS_ONE)])(g)
    assert res.modified
    assert [layer.type for layer in res.graph] == ["Input", "UnaryOp", "BinaryOp", "ReLU"]
    check = _prove(res.graph, g, {"in0": ("T", 5)})
    assert check.ok, check.format()


def test_readme_rules_are_right_at_another_length(tmp_path):
    g = paramsurgery.load(RW / "gelu_tanh.param")
    res = Rewrite(rules=[read_rule_file(RW / "gelu_tanh.rule")])(g)
    assert [layer.type for layer in res.graph].count("GELU") == 1
    check = _prove(res.graph, g, {"in0": ("T", 16)}, lengths=(3, 29))
    assert check.ok, check.format()


def _prove(candidate, reference, shapes, lengths=(7, 11)):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        a, b = f"{tmp}/a.param", f"{tmp}/b.param"
        paramsurgery.save(candidate, a)
        paramsurgery.save(reference, b)
        syms = {d for s in shapes.values() for d in s if isinstance(d, str)}
        return verify_equivalent(a, b, inputshape=shapes, values={s: list(lengths) for s in syms})


def test_fold_constant_layout_is_right_through_ncnn(tmp_path):
    g = paramsurgery.load(FOLD / "rope_table.param", bin=FOLD / "rope_table.bin")
    res = FoldConstantLayout()(g)
    assert res.modified and [layer.type for layer in res.graph] == ["Input", "MemoryData", "BinaryOp", "ReLU"]
    paramsurgery.save(res.graph, tmp_path / "f.param", bin=tmp_path / "f.bin")
    check = verify_equivalent(tmp_path / "f.param", FOLD / "rope_table.param", bin=tmp_path / "f.bin",
                              reference_bin=FOLD / "rope_table.bin", inputshape={"in0": (48, 16)})
    assert check.ok and max(check.rel.values()) == 0.0, check.format()


def test_fold_constant_layout_leaves_a_shared_constant_alone():
    g = paramsurgery.load(FOLD / "rope_table.param", bin=FOLD / "rope_table.bin")
    g.insert_after(g.layer("pnnx_fold_cos"), "ReLU", "also_reads")  # a second reader
    g.insert_splits()
    res = FoldConstantLayout()(g)
    assert not res.modified
