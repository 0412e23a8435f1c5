"""The storage forms of one weight blob in a `.bin` (ncnn `ModelBinFromDataReader::load`,
src/modelbin.cpp; ncnn-format.md §3.1).

A *tagged* read (`mb.load(n, 0)`) starts with a little-endian uint32 tag that selects the
payload that follows; an *untagged* read (`mb.load(n, 1)`) is `4*n` bytes of raw float32.
The ncnn 1.0.20261020 wheel adds a third form for block-quantized Gemm/MultiHeadAttention
weights: untagged packed bytes, `align4(n)` long (measured; see schema.py).

Dispatch order of a tag, as ncnn does it: fp16 → bf16 (wheel only) → int8 → fp32-with-
scaling → byte sum ≠ 0 (256-entry float LUT + uint8 indices) → raw fp32 (tag 0).
Payloads are padded to 4 bytes; the pad bytes are whatever the writer put there
(pnnx: the fp16 value 0x2283, ModelWriter: zeros) and are kept verbatim.
"""

from __future__ import annotations

import struct

import numpy as np

TAG_FP32 = 0x00000000
TAG_FP16 = 0x01306B47
TAG_BF16 = 0x01348B83  # ncnn PR #6900; in the 1.0.20261020 wheel, not in a4d2ea1d4
TAG_INT8 = 0x000D4B38
TAG_FP32_SCALED = 0x0002C056  # "raw data with extra scaling" (ncnn2int8-era tools)

# storage kinds (Weight.dtype)
FP32 = "fp32"
FP16 = "fp16"
BF16 = "bf16"
INT8 = "int8"
FP32_SCALED = "fp32s"
LUT = "lut8"  # 256-entry float32 table + one uint8 index per element
RAW = "raw"  # untagged float32 (`load(n, 1)`)
PACKED = "packed"  # untagged packed bytes (wheel block quantization)

DTYPE_TAG = {FP32: TAG_FP32, FP16: TAG_FP16, BF16: TAG_BF16, INT8: TAG_INT8,
             FP32_SCALED: TAG_FP32_SCALED}
TAG_NAMES = {TAG_FP32: FP32, TAG_FP16: FP16, TAG_BF16: BF16, TAG_INT8: INT8,
             TAG_FP32_SCALED: FP32_SCALED}


def align4(n: int) -> int:
    return (n + 3) & ~3


def tag_dtype(tag: int) -> str:
    """The storage kind a tag selects (ncnn's dispatch order)."""
    if tag in TAG_NAMES:
        return TAG_NAMES[tag]
    if sum(struct.pack("<I", tag)) != 0:
        return LUT
    return FP32  # unreachable: only tag 0 has byte sum 0


def payload_reads(dtype: str, count: int) -> list[int]:
    """Sizes of the reads ncnn makes after the tag for `count` elements (empty reads are
    not made: ncnn asks `reference(0)` first, which succeeds)."""
    if dtype in (FP16, BF16):
        sizes = [align4(2 * count)]
    elif dtype == INT8:
        sizes = [align4(count)]
    elif dtype == LUT:
        # m.create(0) is empty and ncnn returns before reading the table
        sizes = [1024, align4(count)] if count > 0 else []
    elif dtype == PACKED:
        sizes = [align4(count)]
    else:  # fp32, fp32s, raw
        sizes = [4 * count]
    return [s for s in sizes if s > 0]


def payload_size(dtype: str, count: int) -> int:
    return sum(payload_reads(dtype, count))


def data_size(dtype: str, count: int) -> int:
    """Bytes that hold the values (no tag, no pad)."""
    if dtype in (FP16, BF16):
        return 2 * count
    if dtype in (INT8, PACKED):
        return count
    if dtype == LUT:
        return 1024 + count
    return 4 * count


NUMPY_DTYPE: dict[str, np.dtype] = {FP32: np.dtype("<f4"), RAW: np.dtype("<f4"), FP32_SCALED: np.dtype("<f4"),
               FP16: np.dtype("<f2"), BF16: np.dtype("<u2"), INT8: np.dtype("i1"),
               PACKED: np.dtype("u1"), LUT: np.dtype("u1")}


def decode_float32(dtype: str, payload: memoryview | bytes, count: int) -> np.ndarray:
    """The float32 values ncnn has in memory after loading (int8 and packed stay ints:
    ncnn keeps them as 1-byte Mats)."""
    buf = np.frombuffer(payload, dtype=np.uint8)
    if dtype in (FP32, RAW, FP32_SCALED):
        return buf[:4 * count].view("<f4")
    if dtype == FP16:
        return buf[:2 * count].view("<f2").astype(np.float32)
    if dtype == BF16:
        return (buf[:2 * count].view("<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype == LUT:
        table = buf[:1024].view("<f4")
        return table[buf[1024:1024 + count]]
    if dtype == INT8:
        return buf[:count].view(np.int8)
    return buf[:count]


def encode(dtype: str, values: np.ndarray) -> bytes:
    """Payload bytes (no tag, no pad) for float values in a given storage kind.
    fp16 uses numpy's round-to-nearest-even (not pnnx's rounding); bf16 rounds to nearest
    even too. int8/packed take the integer values as they are."""
    v = np.ascontiguousarray(values).reshape(-1)
    if dtype in (FP32, RAW, FP32_SCALED):
        return v.astype("<f4").tobytes()
    if dtype == FP16:
        return v.astype("<f2").tobytes()
    if dtype == BF16:
        if v.dtype == np.uint16:
            return v.astype("<u2").tobytes()
        f = v.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(v.astype(np.float32))
        rounded[nan] = 0x7FC0
        return rounded.astype("<u2").tobytes()
    if dtype == INT8:
        return v.astype(np.int8).tobytes()
    if dtype == PACKED:
        return v.astype(np.uint8).tobytes()
    raise ValueError(f"cannot encode values as {dtype}")


_OUT_DTYPE = {FP32: "<f4", RAW: "<f4", FP32_SCALED: "<f4", FP16: "<f2", INT8: "i1",
              PACKED: "u1"}


def encode_into(dtype: str, values: np.ndarray, out: memoryview) -> None:
    """`encode` straight into a writable buffer of `data_size` bytes (one pass, no
    temporary copy of the payload: replacing a big weight costs its size once)."""
    v = np.asarray(values).reshape(-1)
    dt = _OUT_DTYPE.get(dtype)
    if dt is not None:
        np.copyto(np.frombuffer(out, dtype=dt, count=v.size), v, casting="unsafe")
        return
    out[:] = encode(dtype, v)
