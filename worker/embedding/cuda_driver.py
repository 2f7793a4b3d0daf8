"""Whether the node's NVIDIA driver can run the CUDA that torch was built with.

A CUDA build of torch on a driver older than its CUDA needs does not fail: ``torch.cuda.is_available()``
turns False with a warning, and a worker asked for ``cuda`` could only say that it sees no device.
This module reads the kernel driver's version (``/proc/driver/nvidia/version``, present wherever the
driver is loaded, in a container too when the NVIDIA runtime mounts it) and names both versions.

The floors are NVIDIA's minimum Linux drivers for each CUDA major version under minor-version
compatibility (the CUDA Toolkit release notes, table 2): any 13.x runs on ≥ 580, 12.x on ≥ 525.60.13,
11.x on ≥ 450.80.02. The image's torch 2.13 wheels carry CUDA 13."""

from __future__ import annotations

import re
from pathlib import Path

#: The oldest Linux driver for each CUDA major version.
DRIVER_FLOOR: dict[int, tuple[int, ...]] = {13: (580,), 12: (525, 60, 13), 11: (450, 80, 2)}

#: Where a loaded NVIDIA kernel module says its version.
PROC_VERSION = Path("/proc/driver/nvidia/version")


def driver_version(proc: Path = PROC_VERSION) -> tuple[int, ...] | None:
    """The loaded NVIDIA driver's version (``(580, 65, 6)``), or None where no driver is loaded or
    its file says no version."""
    try:
        text = proc.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text) or re.search(r"\b(\d{3}(?:\.\d+)+)\b",
                                                                                           text)
    return tuple(int(x) for x in found.group(1).split(".")) if found else None


def too_old(cuda: str | None, driver: tuple[int, ...] | None) -> str | None:
    """One line naming both versions where ``driver`` is older than CUDA ``cuda`` (torch's
    ``torch.version.cuda``, "13.0") needs; None where it is new enough, or either is unknown."""
    if not cuda or driver is None:
        return None
    major = int(cuda.split(".")[0])
    floor = DRIVER_FLOOR.get(major)
    if floor is None or driver >= floor:
        return None
    shown = ".".join(map(str, driver))
    return (f"the node's NVIDIA driver {shown} is older than CUDA {cuda} (this image's torch) needs: "
            f"driver {'.'.join(map(str, floor))} or newer; upgrade the node's driver, or schedule the pod on "
            "nodes with a newer one")
