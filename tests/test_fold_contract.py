"""fold-explicit-cache changes what the past inputs mean (issue 14, item 10): it says so in
its report and JSON, and --verify proves the rewrite with a decode loop under the new
contract (ncnn's opaque caches fed back) against the explicit graph fed plain arrays."""

import json

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.passes.fold_explicit_cache import FoldedCache
from paramsurgery.verify.fold import verify_fold
from paramsurgery.passes.fold_explicit_cache import FoldExplicitCache

ncnn = pytest.importorskip("ncnn")

from test_kvcache import EXPLICIT  # SDPA reading Concat(past, current) k and v  # noqa: E402
from paramsurgery.formats.param_text import dumps  # noqa: E402
D, G = 8, 2


def decode_steps(prefill=3, steps=4, seed=0):
    """q/k/v/mask per call: a prefill of `prefill` rows, then single rows."""
    rng = np.random.default_rng(seed)
    out, past = [], 0
    for rows in [prefill] + [1] * steps:
        feeds = {n: rng.standard_normal((G, rows, D)).astype(np.float32) for n in "qkv"}
        feeds["mask"] = np.zeros((rows, past + rows), np.float32)
        out.append(feeds)
        past += rows
    return out


def test_contract_change_is_reported_in_text_and_json(tmp_path, capsys):
    res = FoldExplicitCache()(paramsurgery.loads(EXPLICIT))
    assert len(res.contract_changes) == 1
    assert "now take the opaque cache ncnn returned" in res.contract_changes[0]
    assert "contract change: inputs 'past_k', 'past_v'" in res.format()
    assert res.data["caches"] == [FoldedCache("past_k", "past_v", "kk", "vv", "present_k",
                                              "present_v", "k", "v").__dict__]
    p = tmp_path / "m.param"
    p.write_text(EXPLICIT)
    assert main(["fold-explicit-cache", str(p), "-o", str(tmp_path / "o.param"),
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["contract_changes"] == res.contract_changes


def _feeds_npz(path, steps):
    np.savez(path, **{f"{name}@{i}": a for i, feeds in enumerate(steps)
                      for name, a in feeds.items()})


def test_verify_proves_the_fold_with_a_decode_loop(tmp_path, capsys):
    p, out, feeds = tmp_path / "m.param", tmp_path / "o.param", tmp_path / "feeds.npz"
    p.write_text(EXPLICIT)
    _feeds_npz(feeds, decode_steps())
    assert main(["fold-explicit-cache", str(p), "-o", str(out), "--verify", "--feeds",
                 str(feeds)]) == 0
    text = capsys.readouterr().out
    assert "verify: decode loop (prefill, then 4 step(s)" in text and " ok" in text
    assert out.exists()


def test_the_old_contract_fails_and_verify_refuses_a_wrong_fold(tmp_path, capsys):
    """Fed the plain past arrays the explicit graph takes, the folded graph is wrong: the
    contract did change. A fold whose proof fails writes nothing."""
    res = FoldExplicitCache()(paramsurgery.loads(EXPLICIT))
    steps = decode_steps(seed=1)
    keep = []

    def mat(a):
        a = np.ascontiguousarray(a, np.float32)
        keep.append(a)
        return ncnn.Mat(a).clone()

    nets = []
    for text in (EXPLICIT, dumps(res.graph)):
        net = ncnn.Net()
        net.opt.use_fp16_storage = net.opt.use_fp16_packed = net.opt.use_fp16_arithmetic = False
        assert net.load_param_mem(text) == 0
        net.load_model(ncnn.DataReaderFromEmpty())
        nets.append(net)
    past_k = np.concatenate([s["k"] for s in steps[:2]], axis=1)
    past_v = np.concatenate([s["v"] for s in steps[:2]], axis=1)
    outs = []
    for net in nets:
        ex = net.create_extractor()
        for name, a in {**steps[2], "past_k": past_k, "past_v": past_v}.items():
            ex.input(name, mat(a))
        outs.append(np.array(ex.extract("out0")[1]))
    # plain pasts are not what SDPA 7=1 wants: wrong numbers (or NaN)
    assert not np.allclose(outs[0], outs[1], atol=1e-2)

    # a "fold" that loses the cache (7=1 dropped) fails the proof
    caches = [FoldedCache(**c) for c in res.data["caches"]]
    explicit = tmp_path / "explicit.param"
    explicit.write_text(EXPLICIT)
    good, wrong = tmp_path / "good.param", tmp_path / "wrong.param"
    good.write_text(dumps(res.graph))
    wrong.write_text(dumps(res.graph).replace(" 7=1", ""))
    assert verify_fold(explicit, good, None, caches, steps, ["out0"]).ok
    assert not verify_fold(explicit, wrong, None, caches, steps, ["out0"]).ok


def test_verify_that_cannot_run_writes_nothing(tmp_path, capsys):
    p, out, feeds = tmp_path / "m.param", tmp_path / "o.param", tmp_path / "feeds.npz"
    p.write_text(EXPLICIT)
    steps = decode_steps()
    del steps[1]["q"]  # a step without its query: ncnn cannot run it
    _feeds_npz(feeds, steps)
    assert main(["fold-explicit-cache", str(p), "-o", str(out), "--verify", "--feeds",
                 str(feeds)]) == 2
    assert "could not be proven; nothing written" in capsys.readouterr().err
    assert not out.exists()


SHAPES = "q=[2,T,8] k=[2,T,8] v=[2,T,8] mask=[T,T]"


def test_verify_generates_the_decode_loop_from_inputshape(tmp_path, capsys):
    """Without --feeds the loop's inputs are generated (shapes.feeds by kind: the mask is
    causal) for the whole length and cut per call: a prefill of 3, then single steps."""
    from paramsurgery.verify.fold import PREFILL, STEPS, decode_steps

    res = FoldExplicitCache()(paramsurgery.loads(EXPLICIT))
    caches = [FoldedCache(**c) for c in res.data["caches"]]
    steps = decode_steps(res.graph, caches, paramsurgery.analysis.shapes.parse_inputshape(SHAPES))
    assert len(steps) == 1 + STEPS and set(steps[0]) == {"q", "k", "v", "mask"}
    assert steps[0]["q"].shape == (G, PREFILL, D) and steps[2]["k"].shape == (G, 1, D)
    assert steps[2]["mask"].shape == (1, PREFILL + 2)  # one query row, past + current keys
    assert (steps[0]["mask"][0, 1:] < -1e8).all() and not steps[2]["mask"].any()
    # the generated loop tells a right fold from a wrong one
    explicit, good, wrong = (tmp_path / n for n in ("e.param", "good.param", "wrong.param"))
    explicit.write_text(EXPLICIT)
    good.write_text(dumps(res.graph))
    wrong.write_text(dumps(res.graph).replace(" 7=1", ""))
    assert verify_fold(explicit, good, None, caches, steps, ["out0"]).ok
    assert not verify_fold(explicit, wrong, None, caches, steps, ["out0"]).ok

    p, out = tmp_path / "m.param", tmp_path / "o.param"
    p.write_text(EXPLICIT)
    assert main(["fold-explicit-cache", str(p), "-o", str(out), "--verify",
                 "--inputshape", SHAPES]) == 0
    assert "verify: decode loop (prefill, then 4 step(s)" in capsys.readouterr().out
    assert out.exists()


@pytest.mark.parametrize("extra,why", [
    ([], "missing: q, k, v, mask"),
    (["--inputshape", "q=[2,T,8] k=[2,T,8] v=[2,T,8]"], "missing: mask"),
    (["--inputshape", "q=[2,T,8] k=[2,T,8] v=[2,T,8] mask=[T,S]"], "exactly one symbol"),
    (["--inputshape", SHAPES + " out0=[2,T,8]"], "'out0', not a non-cache input"),
])
def test_verify_without_feeds_refuses_naming_what_it_needs(tmp_path, capsys, extra, why):
    p, out = tmp_path / "m.param", tmp_path / "o.param"
    p.write_text(EXPLICIT)
    assert main(["fold-explicit-cache", str(p), "-o", str(out), "--verify", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{p}:") and why in err, err
    assert not out.exists()
