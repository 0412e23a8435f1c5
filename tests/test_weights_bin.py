"""The `.bin` reader/writer: exact accounting, byte-identical round trips, replacement,
errors that name the layer, and the synth-bin / info --bin commands."""

from __future__ import annotations

import argparse
import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from paramsurgery.core.errors import BinLayoutError
from paramsurgery.formats.io import load, loads
from paramsurgery.formats.weights import (LayerWeights, attach_weights, replace_weight, set_weights,
                                          weight_summary, weights_bytes, weights_fingerprint, write_weights)
from paramsurgery.formats.weights.synth import synth_weights, write_synth_bin
from paramsurgery.formats.io import save

REPO = Path(__file__).resolve().parent.parent
REPRO = REPO / "fixtures" / "repros"

PARAM = """7767517
5 5
Input            in0      0 1 in0
Convolution      conv     1 1 in0 c 0=3 1=1 5=1 6=9
Embed            emb      1 1 in0 e 0=3 1=5 3=15
InnerProduct     fc       1 1 c f 0=2 1=1 2=6
LayerNorm        ln       1 1 f out 0=2
"""


def fp16_pnnx_bin() -> bytes:
    """Blobs as pnnx fp16=1 writes them: fp16 tag, payload, `83 22` pad when odd."""
    def fp16(vals):  # noqa: ANN001, ANN202
        b = np.asarray(vals, np.float16).tobytes()
        return b"\x47\x6b\x30\x01" + b + (b"\x83\x22" if len(vals) % 2 else b"")

    raw = lambda vals: np.asarray(vals, np.float32).tobytes()  # noqa: E731
    return b"".join([fp16(np.arange(9) / 10), raw([0.1, 0.2, 0.3]),      # conv
                     fp16(np.arange(15) / 7),                             # emb (odd -> pad)
                     fp16(np.arange(6) / 3), raw([1, 2]),                 # fc
                     raw([1, 1]), raw([0, 0])])                           # ln


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "m.param"
    p.write_text(PARAM)
    b = tmp_path / "m.bin"
    b.write_bytes(fp16_pnnx_bin())
    return p, b


def test_roundtrip_keeps_tags_and_pnnx_pad(model, tmp_path):
    p, b = model
    g = load(p, bin=b)
    emb = g.layer("emb").weights["weight"]
    assert (emb.dtype, emb.tag, emb.shape, emb.pad) == ("fp16", 0x01306B47, (5, 3), b"\x83\x22")
    assert emb.array().dtype == np.float16 and emb.array().shape == (5, 3)
    assert g.layer("conv").weights["weight"].shape == (3, 3, 1, 1)
    assert g.layer("conv").weights["bias"].dtype == "raw"
    save(g, tmp_path / "o.param", bin=tmp_path / "o.bin")
    assert (tmp_path / "o.bin").read_bytes() == b.read_bytes()
    assert (tmp_path / "o.param").read_bytes() == p.read_bytes()


def test_replace_changes_only_its_bytes(model, tmp_path):
    p, b = model
    g = load(p, bin=b)
    before = weights_fingerprint(g)
    old = g.layer("fc").weights["bias"]
    replace_weight(g.layer("fc"), "bias", np.array([5.0, 6.0], np.float32))
    save(g, tmp_path / "o.param", bin=tmp_path / "o.bin")
    a, c = b.read_bytes(), (tmp_path / "o.bin").read_bytes()
    assert len(a) == len(c)
    diff = [i for i in range(len(a)) if a[i] != c[i]]
    assert diff and min(diff) >= old.offset and max(diff) < old.offset + old.nbytes
    after = weights_fingerprint(g)
    assert [k for k in before if before[k] != after[k]] == ["fc#3"]
    # the untouched layers still are spans of the source file: provably unchanged for free
    assert g.layer("emb").weights.untouched and not g.layer("fc").weights.untouched


def test_replace_keeps_fp16_pad_and_float32_default(model):
    p, b = model
    g = load(p, bin=b)
    emb = g.layer("emb").weights["weight"]
    new16 = emb.replace(emb.array() * 2)           # float16 values -> fp16, pnnx pad kept
    assert new16.dtype == "fp16" and new16.pad == b"\x83\x22"
    new32 = emb.replace(emb.float32() * 2)         # float32 values -> fp32 tag 0
    assert new32.dtype == "fp32" and new32.tag == 0 and new32.nbytes == 4 + 60
    same = emb.replace(emb.float32(), dtype="same")
    assert same.raw().tobytes() == emb.raw().tobytes()
    with pytest.raises(BinLayoutError, match="15 elements"):
        emb.replace(np.zeros(16, np.float32))


def test_resize_needs_params_to_match(model, tmp_path):
    p, b = model
    g = load(p, bin=b)
    emb = g.layer("emb")
    replace_weight(emb, "weight", np.zeros((6, 3), np.float32), allow_resize=True)
    with pytest.raises(BinLayoutError, match="emb.*weight\\[15\\].*weight\\[18\\]"):
        save(g, tmp_path / "o.param", bin=tmp_path / "o.bin")
    assert not (tmp_path / "o.bin").exists()
    emb.set(1, 6).set(3, 18)
    save(g, tmp_path / "o.param", bin=tmp_path / "o.bin")
    g2 = load(tmp_path / "o.param", bin=tmp_path / "o.bin")
    assert g2.layer("emb").weights["weight"].shape == (6, 3)


def test_fused_embed_from_two_tables(model):
    """What a fusing pass does: a new Embed whose table concatenates two fp16 tables,
    bytes kept (no re-encoding)."""
    p, b = model
    g = load(p, bin=b)
    t = g.layer("emb").weights["weight"].array()
    new = g.add_layer("Embed", "emb2", ["in0"], ["e2"], {0: 3, 1: 10, 3: 30})
    set_weights(new, weight=np.concatenate([t, t]))
    w = new.weights["weight"]
    assert w.dtype == "fp16" and w.raw()[4:64].tobytes() == t.tobytes() * 2
    reused = set_weights(g.add_layer("Embed", "emb3", ["in0"], ["e3"], {0: 3, 1: 5, 3: 15}),
                         weight=g.layer("emb").weights["weight"])
    assert reused.weights["weight"].same_bytes(g.layer("emb").weights["weight"])
    out = weights_bytes(g)
    assert len(out) == b.stat().st_size + w.nbytes + g.layer("emb").weights.nbytes
    with pytest.raises(BinLayoutError, match="missing weight 'weight'"):
        set_weights(g.add_layer("Embed", "emb4", ["in0"], ["e4"], {0: 3, 1: 5, 3: 15}))


def test_copy_shares_untouched_weights(model):
    p, b = model
    g = load(p, bin=b)
    c = g.copy()
    assert c.layer("conv").weights is g.layer("conv").weights
    replace_weight(c.layer("conv"), "bias", np.zeros(3, np.float32))
    assert g.layer("conv").weights["bias"].untouched  # the original is unaffected
    assert weights_bytes(g) == b.read_bytes()


def test_short_file_names_layer_and_offset(model, tmp_path):
    p, b = model
    short = tmp_path / "short.bin"
    short.write_bytes(b.read_bytes()[:-6])
    with pytest.raises(BinLayoutError) as e:
        load(p, bin=short)
    msg = str(e.value)
    assert "'ln' (LayerNorm" in msg and "m.param:7" in msg and "beta" in msg
    assert "offset" in msg and "file ends at" in msg


def test_trailing_bytes(model, tmp_path):
    p, b = model
    long = tmp_path / "long.bin"
    long.write_bytes(b.read_bytes() + b"junk")
    with pytest.raises(BinLayoutError, match="'ln'.*4 bytes left over"):
        load(p, bin=long)
    g = load(p)
    attach_weights(g, long, allow_trailing=True)
    assert g.weights.trailing == 4
    out = io.BytesIO()
    write_weights(g, out)
    assert out.getvalue() == long.read_bytes()


def test_wrong_tag_names_layer(model, tmp_path):
    p, b = model
    data = bytearray(b.read_bytes())
    data[0:4] = b"\x12\x34\x56\x78"
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(BinLayoutError,
                       match=r"m.param:4: layer 'conv' \(Convolution\).*unknown tag "
                             r"0x78563412 at offset 0"):
        load(p, bin=bad)


def test_zero_sized_required_weight_is_an_error(tmp_path):
    g = loads("7767517\n2 2\nInput in 0 1 a\nBatchNorm bn 1 1 a b 0=0\n")
    with pytest.raises(BinLayoutError, match="'slope' has 0 elements"):
        attach_weights(g, b"")


def test_unknown_types_are_assumed_weightless(tmp_path):
    text = ("7767517\n3 3\nInput in 0 1 a\ntorch.gt g 1 1 a b\n"
            "InnerProduct fc 1 1 b c 0=1 1=0 2=2\n")
    g = loads(text)
    good = b"\0\0\0\0" + np.ones(2, np.float32).tobytes()
    attach_weights(g, good)
    assert g.layer("g").weights.assumed
    assert weight_summary(g)["assumed_no_weights"][0]["type"] == "torch.gt"
    with pytest.raises(BinLayoutError, match="left over.*torch.gt"):
        attach_weights(loads(text), good + b"\0" * 8)


def test_weights_missing_for_new_layer():
    g = loads("7767517\n2 2\nInput in 0 1 a\nInnerProduct fc 1 1 a b 0=1 2=2\n")
    with pytest.raises(BinLayoutError, match="'fc'.*has no weights"):
        weights_bytes(g)


def test_real_pnnx_bins_roundtrip_and_replace(tmp_path):
    bins = sorted(REPRO.glob("*/*/model.ncnn.bin"))
    assert bins
    for b in bins:
        g = load(b.with_suffix(".param"), bin=b)
        assert weights_bytes(g) == b.read_bytes(), b
        # (a bool MemoryData, pnnx's 21=3, holds packed bytes: replaced by uint8 only)
        layer = next((x for x in g if x.weights and len(x.weights)
                      and x.weights[0].dtype != "packed"), None)
        if layer is None:
            continue
        w = layer.weights[0]
        replace_weight(layer, w.role, np.zeros(w.count, np.float32))
        save(g, tmp_path / "o.param", bin=tmp_path / "o.bin")
        new = (tmp_path / "o.bin").read_bytes()
        old = b.read_bytes()
        assert new[w.offset + w.nbytes:] == old[w.offset + w.nbytes:]
        assert new[:w.offset] == old[:w.offset]


def test_array_views_are_zero_copy(model):
    p, b = model
    g = load(p, bin=b)
    a = g.layer("fc").weights["bias"].array()
    assert not a.flags.writeable and a.base is not None
    assert a.tolist() == [1.0, 2.0]


def test_synth_is_deterministic_and_streams_the_same_bytes():
    g = loads(PARAM)
    out = io.BytesIO()
    n = write_synth_bin(g, out, seed=7, dtype="fp16")
    synth_weights(g, seed=7, dtype="fp16")
    assert weights_bytes(g) == out.getvalue() and n == len(out.getvalue())
    again = io.BytesIO()
    write_synth_bin(loads(PARAM), again, seed=7, dtype="fp16")
    assert again.getvalue() == out.getvalue()
    g2 = loads(PARAM)
    attach_weights(g2, out.getvalue())
    assert g2.layer("emb").weights["weight"].dtype == "fp16"
    assert g2.layer("ln").weights["gamma"].dtype == "raw"
    ln = g2.layer("ln").weights["gamma"].array()
    assert np.all((ln > 0.8) & (ln < 1.2))


def _cli(argv):  # noqa: ANN001, ANN202
    from paramsurgery.commands import info, synth_bin

    parser = argparse.ArgumentParser(prog="paramsurgery")
    sub = parser.add_subparsers()
    synth_bin.register(sub)
    info.register(sub)
    args = parser.parse_args(argv)
    return args.run(args)


def test_synth_bin_and_info_cli(tmp_path, capsys):
    p = tmp_path / "m.param"
    p.write_text(PARAM)
    out = tmp_path / "m.bin"
    assert _cli(["synth-bin", str(p), "-o", str(out), "--seed", "1", "--dtype", "fp16"]) == 0
    g = load(p, bin=out)
    assert g.weights.size == out.stat().st_size
    capsys.readouterr()
    assert _cli(["info", str(p), "--bin", str(out), "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["files"][0]["weights"]
    assert s["total_bytes"] == out.stat().st_size
    assert set(s["by_type"]) == {"Convolution", "Embed", "InnerProduct", "LayerNorm"}
    assert set(s["by_dtype"]) == {"fp16", "raw"}


def test_cli_errors_are_located(tmp_path, capsys):
    from paramsurgery.cli import main

    p = tmp_path / "m.param"
    p.write_text(PARAM)
    b = tmp_path / "m.bin"
    b.write_bytes(b"\0" * 10)
    code = main(["info", str(p), "--bin", str(b)])
    err = capsys.readouterr().err
    assert code == 2 and "m.param:4" in err and "'conv'" in err and "Traceback" not in err


def test_layer_weights_api(model):
    p, b = model
    g = load(p, bin=b)
    lw = g.layer("fc").weights
    assert isinstance(lw, LayerWeights) and lw.roles == ["weight", "bias"]
    assert lw[1] is lw["bias"] and lw.get("nope") is None
    assert len(lw.sha256) == 64 and lw.same_bytes(g.copy().layer("fc").weights)
    assert lw.nbytes == sum(w.nbytes for w in lw)
    struct.unpack("<I", lw["weight"].raw()[:4])


def test_save_in_place_over_the_source(model):
    """Saving over the loaded files: the temp + rename keeps the mapping valid."""
    p, b = model
    orig = b.read_bytes()
    g = load(p, bin=b)
    save(g, p, bin=b)
    assert b.read_bytes() == orig
    replace_weight(g.layer("ln"), "beta", np.array([3.0, 4.0], np.float32))
    save(g, p, bin=b)
    assert b.read_bytes()[:-8] == orig[:-8]
    assert np.frombuffer(b.read_bytes()[-8:], np.float32).tolist() == [3.0, 4.0]


KEPT = """7767517
3 3
MemoryData       pnnx_fold_7  0 1 k 0=1
MemoryData       table        0 1 t 0=3
BinaryOp         add          2 1 k t out 0=0
"""


def test_synth_bin_keeps_given_values_and_refuses_what_cannot_hold_them(tmp_path, capsys):
    """`synth-bin --keep-values X.npz`: the named MemoryData layers get the given values,
    the rest stays the seeded draw; a value that cannot be written as given is a located
    error and no file is left."""
    from paramsurgery.cli import main

    p = tmp_path / "m.param"
    p.write_text(KEPT)
    plain, kept = tmp_path / "plain.bin", tmp_path / "kept.bin"
    np.savez(tmp_path / "v.npz", pnnx_fold_7=np.array([300.0], np.float32))
    assert main(["synth-bin", str(p), "-o", str(plain)]) == 0
    assert main(["synth-bin", str(p), "-o", str(kept), "--keep-values",
                 str(tmp_path / "v.npz")]) == 0
    g, g0 = load(p, bin=kept), load(p, bin=plain)
    assert g.layer("pnnx_fold_7").weights[0].array().tolist() == [300.0]
    assert g0.layer("pnnx_fold_7").weights[0].array().tolist() != [300.0]
    assert g.layer("table").weights.same_bytes(g0.layer("table").weights)
    capsys.readouterr()
    for arrays, says in (({"pnnx_fold_7": np.zeros(2, np.float32)}, "2 given value(s) for a "
                          "weight of 1 elements"),
                         ({"nope": np.zeros(1, np.float32)}, "not in the graph: nope"),
                         ({"add": np.zeros(1, np.float32)}, "read no weights: add")):
        np.savez(tmp_path / "bad.npz", **arrays)
        out = tmp_path / "bad.bin"
        assert main(["synth-bin", str(p), "-o", str(out), "--keep-values",
                     str(tmp_path / "bad.npz")]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and not out.exists(), err
    (tmp_path / "junk.npz").write_text("not a zip")
    assert main(["synth-bin", str(p), "-o", str(tmp_path / "j.bin"), "--keep-values",
                 str(tmp_path / "junk.npz")]) == 2
    assert "junk.npz: not an .npz of arrays" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tmp*")) and not (tmp_path / "j.bin").exists()
