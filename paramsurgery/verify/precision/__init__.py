"""Reduced precision through ncnn: `search` (which layers break under fp16 / bf16, the
smallest set to keep in fp32 with `31=` masks) and `batch` (many variant runs in children).
"""
