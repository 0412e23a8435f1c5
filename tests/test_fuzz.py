"""Mutation fuzzing: truncations, byte flips and absurd counts give our typed errors or a
graph that still round-trips; never another exception, never a huge allocation."""

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paramsurgery
from paramsurgery import ParamSurgeryError

from conftest import CORPUS
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.param_text import dump_bytes

SEEDS = [(CORPUS / n).read_bytes() for n in ("test.param", "mobilenet_ssd.param",
                                            "vision_transformer.param", "nanodet_m.param")]
SEEDS.append(b'7767517\n3 4\nInput in 0 1 in0\nReshape r 1 1 in0 a 6="16,4,0h"\n'
             b"Slice s 1 2 a b c -23300=2,-233,-233 1=0 2=0.5\n")


def exercise(data: bytes) -> None:
    try:
        g = paramsurgery.loads(data)
    except ParamSurgeryError as exc:
        assert exc.line is None or exc.line >= 1
        return
    assert dump_bytes(g) == data
    validate(g)
    for layer in g:
        try:
            layer.params.check()
        except ParamSurgeryError:
            pass


def mutate(data: bytes, rng: random.Random) -> bytes:
    op = rng.randrange(6)
    b = bytearray(data)
    if op == 0:
        return bytes(b[: rng.randrange(len(b) + 1)])
    if op == 1:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if op == 2:
        i = rng.randrange(len(b))
        return bytes(b[:i] + rng.choice([b" ", b"\n", b"=", b",", b'"', b"-233", b"\r"]) + b[i:])
    if op == 3:  # absurd counts
        lines = bytes(b).split(b"\n")
        k = rng.randrange(1, min(len(lines), 6))
        toks = lines[k].split()
        if len(toks) >= 3:
            toks[rng.choice([0, 1, 2, 3][: len(toks)])] = rng.choice(
                [b"2147483647", b"99999999999999999999", b"-1", b"1000000000"])
            lines[k] = b" ".join(toks)
        return b"\n".join(lines)
    if op == 4:
        i, j = sorted(rng.randrange(len(b)) for _ in range(2))
        return bytes(b[:i] + b[j:])
    return bytes(b).replace(b" ", b"\t", rng.randint(1, 5))


@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_mutation_fuzz(seed):
    rng = random.Random(1234 + seed)
    for _ in range(400):
        exercise(mutate(SEEDS[seed], rng))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data):
    exercise(b"7767517\n" + data)
    exercise(data)


def test_huge_header_counts_allocate_nothing():
    data = b"7767517\n1000000 1000000\nInput in 0 1 x\n"  # ncnn's limit: loads, no allocation
    g = paramsurgery.loads(data)
    assert len(g) == 1
    assert "PS101" in [f.code for f in validate(g)]
    with pytest.raises(ParamSurgeryError, match="invalid layer_count or blob_count"):
        paramsurgery.loads(b"7767517\n2147483647 2147483647\nInput in 0 1 x\n")
    with pytest.raises(ParamSurgeryError):
        paramsurgery.loads(b"7767517\n1 1\nInput in 0 2147483647 x\n")


# ---------------------------------------------------------------- differential, vs ncnn
# (tests/fuzz_harness.py: ncnn's loader in batched child processes, our CLI in-process)

def _differential(n: int, seed: int, max_seed_bytes: int, tmp_path, chunk: int = 2000, *,
                  binary: bool = False, writers_every: int = 1):
    from conftest import FIXTURES
    from fuzz_harness import (Report, binary_seeds, check_mutants, mutants_of, mutate,
                              mutate_bin, seeds)

    files = sorted(CORPUS.glob("*.param")) + sorted(FIXTURES.rglob("*.param"))
    if binary:
        files += sorted(FIXTURES.rglob("*.param.bin"))
    seed_files = (binary_seeds if binary else seeds)(files, max_seed_bytes)
    rng = random.Random(seed)
    total = Report()
    for start in range(0, n, chunk):
        mutants = mutants_of(seed_files, min(chunk, n - start), rng,
                             mutate_bin if binary else mutate)
        total.merge(check_mutants(mutants, tmp_path, binary=binary,
                                  writers_every=writers_every))
        if n > chunk:
            print(f"  {total.summary()}", flush=True)
    kind = ".param.bin" if binary else ".param"
    print(f"\ndifferential fuzz of {kind} (seed {seed}, {len(seed_files)} seed files): "
          f"{total.summary()}")
    for cat, (data, detail) in total.examples.items():
        if cat in total.failures:
            print(f"  {cat}: {detail!r}\n    {data[:200]!r}")
    return total


def test_differential_fuzz_against_ncnn(tmp_path):
    """A few hundred seeded mutants: no exit 3, no hang, every exit 2 located, never a
    refusal of a file ncnn loads, never silent where ncnn rejects, fmt, fix and
    remove-passthrough keep loadable files loadable (leaving inputs untouched and no stray
    file), byte-exact round trip of what we accept."""
    pytest.importorskip("ncnn")
    rep = _differential(300, 20261201, 4096, tmp_path, writers_every=2)
    assert rep.mutants == 300 and rep.ncnn_loads > 0
    assert not rep.failures, rep.summary()


def test_differential_fuzz_of_param_bin_against_ncnn(tmp_path):
    """The same for `.param.bin` mutants (word-level edits of every seed as ncnn2mem writes
    it) against ncnn's `load_param_bin`; exit-2 messages name the path and a byte offset."""
    pytest.importorskip("ncnn")
    rep = _differential(200, 20261202, 4096, tmp_path, binary=True, writers_every=2)
    assert rep.mutants == 200 and rep.ncnn_loads > 0
    assert not rep.failures, rep.summary()


@pytest.mark.slow
def test_differential_fuzz_against_ncnn_100k(tmp_path):
    """The same over 100,000 mutants of every corpus and fixture .param up to 4 KB (158
    files; larger seeds cost more per mutant and find the same token-level problems);
    fix and remove-passthrough on every 10th mutant we accept."""
    pytest.importorskip("ncnn")
    n = int(os.environ.get("PARAMSURGERY_FUZZ_MUTANTS", "100000"))
    rep = _differential(n, int(os.environ.get("PARAMSURGERY_FUZZ_SEED", "14")), 4096,
                        tmp_path, writers_every=10)
    assert rep.mutants == n
    assert not rep.failures, rep.summary()


@pytest.mark.slow
def test_differential_fuzz_of_param_bin_against_ncnn_20k(tmp_path):
    """20,000 `.param.bin` mutants."""
    pytest.importorskip("ncnn")
    n = int(os.environ.get("PARAMSURGERY_FUZZ_BIN_MUTANTS", "20000"))
    rep = _differential(n, int(os.environ.get("PARAMSURGERY_FUZZ_SEED", "14")), 4096,
                        tmp_path, binary=True, writers_every=5)
    assert rep.mutants == n
    assert not rep.failures, rep.summary()
