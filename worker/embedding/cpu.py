"""What this CPU offers the model: instruction-set flags read from Linux ``/proc/cpuinfo`` (none
elsewhere, where every answer is False)."""

from __future__ import annotations

from functools import cache
from pathlib import Path


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in a ``/proc/cpuinfo`` text."""
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


@cache
def flags() -> frozenset[str]:
    try:
        return parse_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def has_bf16() -> bool:
    """bf16 matrix instructions (avx512_bf16 or AMX): bf16 runs about 2.5x fp32 there."""
    return bool(flags() & {"avx512_bf16", "amx_bf16"})


def has_vnni() -> bool:
    """int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or AMX): without them, onnxruntime's
    u8×s8 products can saturate, and weights are quantized to 7 bits instead (``reduce_range``)."""
    return bool(flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})
