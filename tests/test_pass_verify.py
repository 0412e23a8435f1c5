"""`--verify` on every declared-pass command: the rewritten graph against the input through
ncnn (`prove_equivalent`) before anything is written; a wrong result exits 1, nothing written."""

from paramsurgery.cli import main
from paramsurgery.passes.fold_constant_layout import FoldConstantLayout

from conftest import FIXTURES

ROPE = FIXTURES / "fold_constants" / "rope_table"
ARGV = ["fold-constant-layout", f"{ROPE}.param", "--bin", f"{ROPE}.bin", "--verify",
        "--inputshape", "in0=[48,16]"]


def test_verify_passes_through_ncnn(tmp_path, capsys):
    out = tmp_path / "o.param"
    assert main(ARGV + ["-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fixed shapes: max rel 0.00e+00 over out0 (ok)" in text
    assert "not verified" not in text and out.exists()


def test_verify_catches_a_wrong_rewrite(tmp_path, capsys, monkeypatch):
    run = FoldConstantLayout.run

    def corrupted(self, g):
        result = run(self, g)
        result.graph.layer("mul_3").set(0, 0)  # the product becomes a sum: a wrong rewrite
        return result

    monkeypatch.setattr(FoldConstantLayout, "run", corrupted)
    assert main(ARGV + ["-o", str(tmp_path / "o.param")]) == 1
    err = capsys.readouterr().err
    assert "refusing to write" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_verify_refuses_a_changed_interface(tmp_path, capsys, monkeypatch):
    run = FoldConstantLayout.run

    def renamed(self, g):
        result = run(self, g)
        result.graph.rename_blob("out0", "logits")
        return result

    monkeypatch.setattr(FoldConstantLayout, "run", renamed)
    assert main(ARGV + ["-o", str(tmp_path / "o.param")]) == 2
    err = capsys.readouterr().err
    assert ("--verify: the pass changed the graph's outputs (gone: out0; new: logits)" in err
            and "Traceback" not in err)
    assert list(tmp_path.iterdir()) == []
