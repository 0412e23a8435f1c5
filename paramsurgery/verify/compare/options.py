"""`--options`: ncnn `Option` settings for one side of a comparison.

Runs start from the parity setting (every fp16/bf16 option off, packing on, one thread,
light mode off so every blob can be extracted); `--options` changes it:
`fp16` (fp16 storage, packed and arithmetic), `bf16`, `threads=N`, `packing=0`, or any
`ncnn.Option` attribute by name (`use_winograd_convolution=0`).
"""

from __future__ import annotations

from paramsurgery.core.errors import ParamSurgeryError

PARITY: dict[str, object] = {
    "use_fp16_storage": False, "use_fp16_packed": False, "use_fp16_arithmetic": False,
    "use_bf16_storage": False, "use_bf16_packed": False,
    "use_packing_layout": True, "num_threads": 1, "lightmode": False,
    "use_vulkan_compute": False,
}

ALIASES: dict[str, dict[str, object]] = {
    "fp16": {"use_fp16_storage": True, "use_fp16_packed": True, "use_fp16_arithmetic": True},
    "bf16": {"use_bf16_storage": True, "use_bf16_packed": True},
}

SHORT_NAMES = {"threads": "num_threads", "packing": "use_packing_layout"}


def parse_options(text: str | None) -> dict[str, object]:
    """`fp16,threads=2` → the ncnn Option attributes to set on top of the parity setting.
    Raises ParamSurgeryError (exit 2) for a name ncnn's Option does not have."""
    settings = dict(PARITY)
    if not text:
        return settings
    known = _option_names()
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq and key in ALIASES:
            settings.update(ALIASES[key])
            continue
        if not eq and key.startswith("no-") and key[3:] in ALIASES:
            settings.update({k: False for k in ALIASES[key[3:]]})
            continue
        name = SHORT_NAMES.get(key, key)
        if known is not None and name not in known:
            raise ParamSurgeryError(f"--options: unknown ncnn option {key!r} (use fp16, bf16, "
                                    f"threads=N, packing=0/1 or an ncnn.Option attribute)")
        if not eq:
            settings[name] = True
            continue
        try:
            settings[name] = int(value) if name == "num_threads" else bool(int(value))
        except ValueError:
            raise ParamSurgeryError(f"--options: {key}={value!r} is not a number") from None
    return settings


def _option_names() -> set[str] | None:
    try:
        import ncnn
    except ImportError:
        return None
    return {n for n in dir(ncnn.Option()) if not n.startswith("_")}


def describe(settings: dict[str, object]) -> str:
    """The settings that differ from parity, for the report header."""
    diff = [f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in settings.items()
            if PARITY.get(k) != v]
    return ",".join(diff) if diff else "fp32"
