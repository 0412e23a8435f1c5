"""Every `.param` of the corpus and the fixtures against ncnn's own reads.

- every distinct weighted layer configuration found in any of them, in one net, with
  synthetic fp32 and fp16 weights;
- every whole net: with its real pnnx `.bin` when the fixture has one, else a zero-filled
  (sparse) `.bin` of the predicted size (all-zero bytes are valid fp32 weights) or a
  synth-bin file; nets ncnn cannot load whole (types it lacks, params it rejects) are
  checked through their weighted layers only (`weights_only_param`);
- synth-bin weights run: every corpus net whose inputs have shapes produces finite outputs.
Fixtures that other work adds later (fixtures/qwen3_tts, fixtures/repros, ...) are found by
globbing. Big nets go to the slow tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.formats.io import load, loads
from paramsurgery.core.layer_types import is_ncnn_layer
from paramsurgery.formats.weights import attach_weights, weights_bytes
from paramsurgery.formats.weights.oracle import compare, predicted_reads, record_many, weights_only_param
from paramsurgery.formats.weights.schema import layer_reads
from paramsurgery.formats.weights.synth import synth_size, synth_weights, write_synth_bin

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
SHARED = REPO.parent / "shared" / "corpus" / "ncnn"
FAST_LIMIT = 64 << 20  # bytes of weights a fast whole-net check may load (bigger: slow)
UNREGISTERED = {"ArgMax", "SPP"}  # in the type table, not built into the wheel


def all_params() -> list[Path]:
    """Every ncnn param (text or binary) in the fixtures and the shared corpus, deduplicated
    by content; pnnx IR files (`*.pnnx.param`) are not ncnn params."""
    seen: dict[str, Path] = {}
    cands = sorted(FIXTURES.rglob("*.param")) + sorted(FIXTURES.rglob("*.param.bin"))
    if SHARED.is_dir():
        cands += sorted(SHARED.glob("*.param")) + sorted(SHARED.glob("*.param.bin"))
    for p in cands:
        if p.name.endswith(".pnnx.param"):
            continue
        if p.suffix == ".param" and _has_bool_memorydata(p):
            continue
        try:
            h = hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError:  # being regenerated right now
            continue
        seen.setdefault(h, p)
    return sorted(seen.values())


def _has_bool_memorydata(p: Path) -> bool:
    """pnnx's bool masks (`MemoryData ... 21=3`, the zoo's GPT-2 eager exports): ncnn has
    no such load type ("ModelBin load type 3 not implemented") and the schema refuses them
    with a located error, so there is no read sequence to hold against ncnn's."""
    try:
        text = p.read_text(errors="replace")
    except OSError:
        return False
    return any(ln.startswith("MemoryData") and " 21=3" in ln for ln in text.splitlines())


def bin_of(p: Path) -> Path | None:
    name = p.name
    if name.endswith(".param.bin"):
        return None
    b = p.with_name(name[:-len(".param")] + ".bin")
    return b if b.exists() else None


def predicted_size(g) -> int:  # noqa: ANN001
    return synth_size(g)


def _parse_all():  # noqa: ANN202
    out = []
    for p in all_params():
        try:
            out.append((p, load(p)))
        except ParamSurgeryError as exc:  # the parser's tests own these files
            out.append((p, exc))
    return out


PARSED = _parse_all()


def test_found_the_fixtures():
    names = {p.name for p, _ in PARSED}
    assert "squeezenet_v1.1.param" in names and "squeezenet_v1.1.param.bin" in names
    assert len(PARSED) >= 38


def _signature(layer):  # noqa: ANN001, ANN202
    return (layer.type, tuple(layer.params.tokens()), len(layer.inputs), len(layer.outputs))


def test_every_layer_configuration_read_for_read(tmp_path):
    """Each distinct (type, params, #bottoms) of a weighted layer in any param (up to 64K
    elements; bigger ones are in the whole-net checks), in one net, fp16 synth weights."""
    sigs: dict = {}
    for p, g in PARSED:
        if isinstance(g, Exception):
            continue
        for layer in g:
            reads = layer_reads(layer)
            if reads and sum(r.count for r in reads) <= (1 << 16):  # bigger: whole-net tests
                sigs.setdefault(_signature(layer), layer)
    assert len(sigs) > 500
    n_in = max(s[2] for s in sigs)
    ins = [f"in{i}" for i in range(max(1, n_in))]
    lines = [f"Input in 0 {len(ins)} {' '.join(ins)}"]
    nb = len(ins)
    for i, (t, toks, nin, nout) in enumerate(sigs):
        outs = [f"l{i}o{j}" for j in range(nout)]
        nb += nout
        lines.append(f"{t} l{i} {nin} {nout} {' '.join(ins[:nin] + outs)} {' '.join(toks)}")
    text = f"7767517\n{len(lines)} {nb}\n" + "\n".join(lines) + "\n"
    param = tmp_path / "all.param"
    param.write_text(text)
    jobs, preds = [], []
    for dtype in ("fp16",):  # fp32 (tag 0) layouts: the zero-bin whole-net checks
        g = loads(text)
        synth_weights(g, seed=11, dtype=dtype)
        b = tmp_path / f"all_{dtype}.bin"
        b.write_bytes(weights_bytes(g))
        g2 = loads(text)
        attach_weights(g2, b)
        preds.append(predicted_reads(g2))
        jobs.append((str(param), str(b)))
    for pred, rec in zip(preds, record_many(jobs)):
        assert compare(pred, rec) is None, compare(pred, rec)
        assert len(pred) > 2000


def _whole_net_jobs(tmp_path: Path, limit: int | None):  # noqa: ANN202
    jobs = []
    for i, (p, g) in enumerate(PARSED):
        if isinstance(g, Exception):
            continue
        real = bin_of(p)
        size = real.stat().st_size if real else predicted_size(g)
        if limit is not None and size > limit:
            continue
        if real is not None:
            bins = [real]
        else:
            zero = tmp_path / f"{i}_zero.bin"
            with open(zero, "wb") as fh:
                fh.truncate(size)  # sparse: all zeros = fp32 weights with tag 0
            bins = [zero]
            if size < (8 << 20):
                s = tmp_path / f"{i}_synth16.bin"
                with open(s, "wb") as fh:
                    write_synth_bin(g, fh, seed=i, dtype="fp16")
                bins.append(s)
        for b in bins:
            jobs.append((p, g, b))
    return jobs


def _check_jobs(jobs, tmp_path: Path) -> int:  # noqa: ANN001
    whole = [j for j in jobs if all(is_ncnn_layer(x.type) and x.type not in UNREGISTERED
                                   for x in j[1])]
    preds = {}
    for p, g, b in jobs:
        g2 = load(p)
        attach_weights(g2, b)
        preds[(p, b)] = (g2, predicted_reads(g2))
    recs = record_many([(str(p), str(b)) for p, _, b in whole])
    fallback = []
    for (p, g, b), rec in zip(whole, recs):
        if rec.load_param != 0:  # a weightless layer ncnn rejects: check the weighted ones
            fallback.append((p, g, b))
            continue
        assert compare(preds[(p, b)][1], rec) is None, (p, b, compare(preds[(p, b)][1], rec))
    fallback += [j for j in jobs if j not in whole]
    wjobs = []
    for k, (p, g, b) in enumerate(fallback):
        wp = tmp_path / f"w{k}.param"
        wp.write_text(weights_only_param(preds[(p, b)][0]))
        wjobs.append((str(wp), str(b)))
    for (p, g, b), rec in zip(fallback, record_many(wjobs)):
        assert compare(preds[(p, b)][1], rec) is None, (p, b, compare(preds[(p, b)][1], rec))
    return len(jobs)


def test_whole_nets_read_for_read(tmp_path):
    jobs = _whole_net_jobs(tmp_path, FAST_LIMIT)
    assert _check_jobs(jobs, tmp_path) > 60


@pytest.mark.slow
def test_whole_big_nets_read_for_read(tmp_path):
    jobs = [j for j in _whole_net_jobs(tmp_path, None)
            if (j[2].stat().st_size > FAST_LIMIT)]
    for job in jobs:  # one at a time: some load GBs into ncnn
        _check_jobs([job], tmp_path)
        if "_zero" in job[2].name:
            job[2].unlink()


def test_real_bins_roundtrip_byte_identical():
    n = 0
    for p, g in PARSED:
        b = bin_of(p)
        if b is None or isinstance(g, Exception):
            continue
        g = load(p, bin=b)
        assert weights_bytes(g) == b.read_bytes(), p
        n += 1
    assert n >= 20


# ----------------------------------------------------------------------------- synth runs

_RUNNER = r"""
import json, sys
import numpy as np, ncnn
jobs = json.loads(sys.stdin.read())
for i, job in enumerate(jobs):
    net = ncnn.Net()
    for k in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
        setattr(net.opt, k, False)
    net.opt.num_threads = 1
    net.opt.lightmode = False
    net.opt.use_vulkan_compute = False
    res = {"i": i, "lp": net.load_param(job["param"])}
    if res["lp"] == 0:
        res["lm"] = net.load_model(job["bin"])
        ex = net.create_extractor()
        rng = np.random.default_rng(0)
        keep = []
        for name, shape in job["inputs"]:
            x = rng.uniform(-1, 1, shape).astype(np.float32)
            keep.append(x)
            ex.input(name, ncnn.Mat(x).clone())
        outs = {}
        for name in job["outputs"]:
            ret, m = ex.extract(name)
            a = np.array(m)
            outs[name] = [ret, list(a.shape), bool(np.isfinite(a).all()),
                          float(np.abs(a).max()) if a.size else 0.0]
        res["outs"] = outs
    print(json.dumps(res), flush=True)
"""

_DETECTION = {"DetectionOutput", "Yolov3DetectionOutput", "YoloDetectionOutput", "Noop"}


def _run_jobs(jobs: list[dict]) -> list[dict]:
    out: list[dict | None] = [None] * len(jobs)
    start = 0
    while start < len(jobs):
        proc = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(jobs[start:]),
                              capture_output=True, text=True, timeout=900)
        done = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        for d in done:
            out[start + d["i"]] = d
        nxt = start + len(done)
        if proc.returncode != 0 and nxt < len(jobs):
            out[nxt] = {"crash": proc.returncode, "stderr": proc.stderr[-500:]}
            nxt += 1
        start = nxt
    return out  # type: ignore[return-value]


def _finite_jobs(tmp_path: Path, small: bool) -> list[dict]:
    jobs = []
    for i, (p, g) in enumerate(PARSED):
        if isinstance(g, Exception) or "ncnn_corpus" not in str(p) or not p.name.endswith(".param"):
            continue
        if any(not is_ncnn_layer(x.type) or x.type in UNREGISTERED for x in g):
            continue
        shapes = []
        for layer in g.by_type("Input"):
            w, h, c = (layer.params.get(k, 0) for k in (0, 1, 2))
            if not (isinstance(w, int) and w > 0 and h > 0 and c > 0):
                shapes = None
                break
            shapes += [(b, [c, h, w]) for b in layer.outputs]
        if not shapes:
            continue
        size = predicted_size(g)
        if (size <= (60 << 20)) != small:
            continue
        b = tmp_path / f"{p.stem}.bin"
        with open(b, "wb") as fh:
            write_synth_bin(g, fh, seed=1)
        outs = []
        for o in g.outputs:
            prod = g.producer(o)
            outs += list(prod.inputs) if prod.type in _DETECTION else [o]
        jobs.append({"param": str(p), "bin": str(b), "inputs": shapes, "outputs": outs})
    return jobs


def _assert_finite(jobs: list[dict], results: list[dict]) -> None:
    for job, res in zip(jobs, results):
        assert res and "crash" not in res, (job["param"], res)
        assert res["lp"] == 0 and res["lm"] == 0, (job["param"], res)
        for name, (ret, shape, finite, amax) in res["outs"].items():
            assert ret == 0 and finite and np.prod(shape) > 0, (job["param"], name, shape)


def test_synth_bin_weights_run_finite(tmp_path):
    jobs = _finite_jobs(tmp_path, small=True)
    assert len(jobs) >= 25
    _assert_finite(jobs, _run_jobs(jobs))


@pytest.mark.slow
def test_synth_bin_weights_run_finite_big(tmp_path):
    jobs = _finite_jobs(tmp_path, small=False)
    for job in jobs:
        _assert_finite([job], _run_jobs([job]))
        os.unlink(job["bin"])


# ----------------------------------------------------------------------------- pnnx exports

@pytest.mark.slow
@pytest.mark.parametrize("fp16", [False, True])
def test_pnnx_export_bins(tmp_path, fp16):
    torch = pytest.importorskip("torch")
    from paramsurgery.repro.pnnx_export import export_with_pnnx
    from paramsurgery.formats.weights.oracle import check

    nn = torch.nn

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 5, 3, padding=1)
            self.prelu = nn.PReLU(5)
            self.dw = nn.Conv2d(5, 5, 3, padding=1, groups=5, bias=False)
            self.deconv = nn.ConvTranspose2d(5, 3, 2, stride=2)
            self.gn = nn.GroupNorm(1, 3)
            self.conv1d = nn.Conv1d(4, 7, 3)
            self.lin = nn.Linear(7, 9)
            self.ln = nn.LayerNorm(9)
            self.gru = nn.GRU(9, 5, batch_first=True)
            self.lstm = nn.LSTM(5, 3, batch_first=True, bidirectional=True)
            self.emb = nn.Embedding(11, 7)
            self.mha = nn.MultiheadAttention(7, 1, batch_first=True)

        def forward(self, x, y, ids):  # noqa: ANN001, ANN201
            a = self.gn(self.deconv(self.dw(self.prelu(self.conv(x)))))
            b = self.ln(self.lin(self.conv1d(y).transpose(1, 2)))
            b, _ = self.gru(b)
            b, _ = self.lstm(b)
            e = self.emb(ids)
            e, _ = self.mha(e, e, e)
            return a, b, e

    inputs = (torch.rand(1, 3, 8, 8), torch.rand(1, 4, 10), torch.randint(0, 11, (1, 5)))
    r = export_with_pnnx(M().eval(), inputs, tmp_path, "m", fp16=fp16)
    assert r.returncode == 0 and r.ncnn_bin is not None, r.stderr[-500:]
    g = load(r.ncnn_param, bin=r.ncnn_bin)
    assert weights_bytes(g) == r.ncnn_bin.read_bytes()
    dtypes = {w.dtype for layer in g for w in (layer.weights or ())}
    assert ("fp16" in dtypes) == fp16 and "raw" in dtypes
    if fp16:  # pnnx pads odd fp16 blobs with the fp16 value 0x2283
        assert any(w.pad == b"\x83\x22" for layer in g for w in (layer.weights or ()))
    report = check(str(r.ncnn_param), str(r.ncnn_bin), graph=g)
    assert report.ok, str(report)
