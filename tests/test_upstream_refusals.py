"""The zoo's cells refused for an upstream reason (issue 24) say so: the refusal names the
layer, what would fix it upstream (pnnx inputshape2=, a longer pair) and the repro case of
pnnx's behaviour; it never asks for what was given (the --pair route does not say "give
--pair"). compare --pnnx reports a failure inside pnnx's script as pnnx's, with its case."""

from __future__ import annotations

from pathlib import Path

import pytest

from paramsurgery.cli import main
from paramsurgery.repro.cases import case_ids
from paramsurgery.verify.compare.torch_run import KNOWN_PNNX_FAILURES, blame, pnnx_failure

ZOO = Path(__file__).resolve().parent.parent / "fixtures" / "zoo"


def _fix(capsys, family: str, route: str, tmp_path: Path, *extra: str) -> str:
    param = ZOO / family / f"{route}.ncnn.param"
    rc = main(["fix", str(param), "--bin", str(param.with_suffix(".bin")),
               "-o", str(tmp_path / "out.ncnn.param"), *extra])
    captured = capsys.readouterr()
    assert rc == 2 and not (tmp_path / "out.ncnn.param").exists()
    return captured.out + captured.err


def _refusal(text: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith("dynamize: refused"))


@pytest.mark.parametrize("family,layer", [("gpt2", "pnnx_fold_position_embeds.1"),
                                          ("bert", "pnnx_fold_63")])
def test_static_learned_table_names_the_fold_and_its_repro(capsys, tmp_path, family, layer):
    text = _refusal(_fix(capsys, family, "embeds_sdpa_static", tmp_path))
    assert f"{layer}: a learned position table of 7 rows" in text
    assert "no rows for T=11" in text and "inputshape2=" in text
    assert "paramsurgery repro issue folded-position-table" in text


@pytest.mark.parametrize("family,route,layer", [
    ("gpt2", "embeds_sdpa", "pnnx_fold_position_embeds.1"),
    ("whisper_encoder", "x_sdpa", "pnnx_fold_57")])
def test_pair_shorter_than_the_reference_says_what_it_serves(capsys, tmp_path, family, route,
                                                             layer):
    """A pair at T=10 has rows 0..9: the reference at T=11 needs row 10, in neither file;
    its .bin would not let fix proceed, so the refusal does not ask for it as the fix: it
    says the pair serves lengths up to 10 (provable against a reference within them) and
    what the reference's length needs."""
    pair = ZOO / family / f"{route}_static2.ncnn.param"
    text = _refusal(_fix(capsys, family, f"{route}_static", tmp_path, "--pair", str(pair)))
    assert text.startswith(f"dynamize: refused (rolled back): {layer}: MemoryData 1=7")
    assert "needs 11 rows, the paired export has 10" in text
    assert "serves lengths up to 10 only" in text
    assert "give --pair" not in text and "give --pair-bin" not in text
    assert "inputshape2=" in text and "repro issue folded-position-table" in text
    assert text.count("inputshape2=") == 1


@pytest.mark.parametrize("family,conv,table", [("vit", "Convolution 'conv_6'", "pnnx_fold_83"),
                                               ("whisper_encoder", "Convolution1D 'conv1d_9'",
                                                "pnnx_fold_57")])
def test_length_lost_at_a_conv_names_the_folded_table(capsys, tmp_path, family, conv, table):
    text = _refusal(_fix(capsys, family, "x_sdpa_static", tmp_path))
    assert f"loses the length at {conv}" in text and "inputshape2=" in text
    assert f"pnnx also folded {table}" in text
    assert "folded-position-table, folded-interpolated-table" in text


def test_named_repro_cases_exist() -> None:
    for case in ("folded-position-table", "folded-interpolated-table",
                 *(c for _, _, c in KNOWN_PNNX_FAILURES)):
        assert case in case_ids()


def _traceback(script: str, torch_file: str) -> str:
    return "\n".join([
        "Traceback (most recent call last):",
        '  File "/x/paramsurgery/verify/compare/torch_child.py", line 9, in main',
        "    capture_forward(model, args, fh)",
        f'  File "{script}", line 151, in forward',
        "    v_82 = self.model_lm_head(v_1, v_81)",
        f'  File "{torch_file}", line 1773, in _call_impl',
        "    return forward_call(*args, **kwargs)",
        "TypeError: Linear.forward() takes 2 positional arguments but 3 were given", ""])


def test_a_failure_in_pnnx_script_is_pnnx_with_its_line_and_case(tmp_path) -> None:
    script = str(tmp_path / "m_pnnx.py")
    tb = _traceback(script, "/usr/lib/torch/nn/modules/module.py")
    assert blame(tb, script) == "pnnx"
    msg = pnnx_failure(tb, script)
    assert msg.startswith("line 151 `v_82 = self.model_lm_head(v_1, v_81)`: TypeError: "
                          "Linear.forward()")
    assert "2-input nn.Linear" in msg and "paramsurgery repro issue tied-linear" in msg
    # an unknown error keeps the line and the exception, and names no case
    other = tb.replace("TypeError: Linear.forward() takes 2 positional arguments but 3 were "
                       "given", "RuntimeError: shape mismatch")
    assert pnnx_failure(other, script).endswith("`: RuntimeError: shape mismatch")
    assert "repro" not in pnnx_failure(other, script)
