"""The driver floor: a node's NVIDIA driver too old for the image's CUDA is one line naming both."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from schemas.errors import ConfigError
from worker.embedding import cuda_driver, sentence

pytestmark = pytest.mark.fast

CLOSED = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
          "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)"
        "  Sun Jul 27 06:54:38 UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n")


def test_the_version_is_read_from_either_kernel_module(tmp_path):
    f = tmp_path / "version"
    f.write_text(CLOSED)
    assert cuda_driver.driver_version(f) == (535, 104, 5)
    f.write_text(OPEN)
    assert cuda_driver.driver_version(f) == (580, 65, 6)
    f.write_text("GCC version: gcc version 12.2.0\n")
    assert cuda_driver.driver_version(f) is None
    assert cuda_driver.driver_version(tmp_path / "absent") is None


@pytest.mark.parametrize("cuda, driver, old", [
    ("13.0", (535, 104, 5), True), ("13.0", (579, 99), True), ("13.0", (580,), False), ("13.0", (580, 65, 6), False),
    ("12.8", (525, 60, 12), True), ("12.8", (525, 60, 13), False), ("12.1", (550, 54), False),
    ("11.8", (450, 80, 2), False), ("11.8", (418, 0), True),
    (None, (535, 0), False), ("13.0", None, False), ("99.0", (100,), False),
])
def test_each_cuda_major_has_its_floor(cuda, driver, old):
    line = cuda_driver.too_old(cuda, driver)
    assert (line is not None) == old
    if line:
        assert ".".join(map(str, driver)) in line and f"CUDA {cuda}" in line
        assert ".".join(map(str, cuda_driver.DRIVER_FLOOR[int(cuda.split(".")[0])])) in line


def _torch(monkeypatch, available: bool, cuda: str | None) -> None:
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: available),
                                 version=types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "torch", fake)


def test_a_worker_asked_for_cuda_on_an_old_driver_names_both_versions(monkeypatch, caplog):
    _torch(monkeypatch, False, "13.0")
    monkeypatch.setattr(cuda_driver, "driver_version", lambda: (550, 127, 8))
    with pytest.raises(ConfigError) as err:
        sentence.pick_device("cuda")
    assert "driver 550.127.8 is older than CUDA 13.0" in str(err.value) and "580 or newer" in str(err.value)
    with caplog.at_level(logging.WARNING):
        assert sentence.pick_device("auto") == "cpu"
    assert "running on the CPU: the node's NVIDIA driver 550.127.8" in caplog.text
    assert sentence.pick_device("cpu") == "cpu"


def test_no_driver_says_torch_sees_no_device_and_a_new_one_runs(monkeypatch, caplog):
    _torch(monkeypatch, False, "13.0")
    monkeypatch.setattr(cuda_driver, "driver_version", lambda: None)
    with pytest.raises(ConfigError, match="torch sees no CUDA device"):
        sentence.pick_device("cuda")
    with caplog.at_level(logging.WARNING):
        assert sentence.pick_device("auto") == "cpu"
    assert caplog.text == ""
    _torch(monkeypatch, True, "13.0")
    assert sentence.pick_device("auto") == "cuda" and sentence.pick_device("cuda") == "cuda"
    assert sentence.pick_device("cpu") == "cpu"
