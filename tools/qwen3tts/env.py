"""Importing qwen_tts 0.1.1 without torchaudio, the arithmetic every fixture is computed
with, and the versions the manifest records.

The arithmetic is pinned (`pin_arithmetic`, before torch is imported, inherited by pnnx):
torch's float32 reductions round differently with the vector width it dispatches to
(the DEFAULT kernels vs AVX2/AVX512: the weights' jitter scale, `t.pow(2).mean()`, moves by
an ulp) and with the thread count on tensors above its grain size (32768 elements: the
codec's waveform convolutions, so the references moved, e.g. the ported codec's rel
7.79e-06 recorded vs 7.33e-06 regenerated at 2 threads, 7.51e-06 at 1). AVX2 (every x86-64
of the last decade; AVX512 machines give the same weights and references when told to use
it) and 1 thread make a rebuild byte-identical across such machines.

torchaudio cannot be installed next to torch 2.13.0 (its newest release needs torch 2.11),
but `import qwen_tts` imports it eagerly for the 25 Hz tokenizer, which we never build.
The stub must be installed *after* `transformers.utils.import_utils` has run its
`find_spec("torchaudio")` probes: a stub without `__spec__` present at that time makes
transformers raise `ValueError: torchaudio.__spec__ is None` (qwen3-tts.md §2).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import types
from typing import Any


# environment torch (and the pnnx it runs) reads at import: the fixtures' arithmetic
ARITHMETIC = {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def pin_arithmetic() -> None:
    """Set `ARITHMETIC` in the environment; must run before torch is imported (it reads the
    capability and the thread count once)."""
    if "torch" in sys.modules:
        raise RuntimeError("pin_arithmetic() must run before torch is imported")
    os.environ.update(ARITHMETIC)


def _install_torchaudio_stub() -> None:
    if "torchaudio" in sys.modules:
        return
    import transformers.utils.import_utils  # noqa: F401  - probes must run before the stub exists

    ta = types.ModuleType("torchaudio")
    ta.compliance = types.ModuleType("torchaudio.compliance")  # type: ignore[attr-defined]
    ta.compliance.kaldi = types.ModuleType("torchaudio.compliance.kaldi")  # type: ignore[attr-defined]
    sys.modules.update({
        "torchaudio": ta,
        "torchaudio.compliance": ta.compliance,  # type: ignore[attr-defined]
        "torchaudio.compliance.kaldi": ta.compliance.kaldi,  # type: ignore[attr-defined]
    })


def import_qwen_tts() -> Any:
    """Import and return the `qwen_tts` package (with the torchaudio stub in place)."""
    _install_torchaudio_stub()
    import qwen_tts  # noqa: WPS433 - deliberately lazy

    return qwen_tts


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def tool_versions() -> dict[str, str | None]:
    """Versions of everything that shapes a fixture (read from the installed
    distributions, so no heavy import is needed)."""
    return {
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "pnnx": _dist_version("pnnx"),
        "ncnn": _dist_version("ncnn"),
        "transformers": _dist_version("transformers"),
        "qwen-tts": _dist_version("qwen-tts"),
        "numpy": _dist_version("numpy"),
        "cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
        "threads": os.environ.get("OMP_NUM_THREADS"),
    }
