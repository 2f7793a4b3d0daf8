"""The GPU gauges, read from NVML at each scrape (a stand-in NVML here: no GPU on these machines)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from worker.process.gpu_metrics import GpuCollector, register_gpu_metrics


class FakeNvml:
    """The four NVML calls the collector makes, over two devices; device 1 fails on ``broken``."""

    def __init__(self) -> None:
        self.broken = False
        self.busy = [37, 100]

    def nvmlInit(self):  # noqa: N802 (NVML's names)
        pass

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        if self.broken and handle == 1:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return SimpleNamespace(gpu=self.busy[handle], memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        return SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30, free=0)


def _scrape(registry) -> str:
    return generate_latest(registry).decode()


def test_each_scrape_reads_the_devices_now():
    nvml, registry = FakeNvml(), CollectorRegistry()
    registry.register(GpuCollector(nvml))
    text = _scrape(registry)
    assert 'embedstream_gpu_utilization_ratio{gpu="0"} 0.37' in text
    assert 'embedstream_gpu_utilization_ratio{gpu="1"} 1.0' in text
    assert 'embedstream_gpu_memory_used_bytes{gpu="1"} 2.147483648e+09' in text
    assert 'embedstream_gpu_memory_total_bytes{gpu="0"} 8.589934592e+10' in text
    nvml.busy[0] = 5
    assert 'embedstream_gpu_utilization_ratio{gpu="0"} 0.05' in _scrape(registry)


def test_a_device_that_stops_answering_is_left_out_not_an_error():
    nvml, registry = FakeNvml(), CollectorRegistry()
    registry.register(GpuCollector(nvml))
    nvml.broken = True
    text = _scrape(registry)
    assert 'gpu="0"' in text and 'gpu="1"' not in text


def test_registered_only_on_cuda_and_only_where_nvml_answers(monkeypatch):
    registry = CollectorRegistry()
    assert register_gpu_metrics("cpu", registry) is None
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    assert isinstance(register_gpu_metrics("cuda", registry), GpuCollector)
    assert "embedstream_gpu_utilization_ratio" in _scrape(registry)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert register_gpu_metrics("cuda", CollectorRegistry()) is None


def test_a_second_member_of_the_process_registers_nothing_more_each_family_shows_once(monkeypatch):
    registry = CollectorRegistry()
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    first = register_gpu_metrics("cuda", registry)  # the live lane
    assert register_gpu_metrics("cuda", registry) is first  # the backfill lane, on the same device
    text = _scrape(registry)
    for name in ("embedstream_gpu_utilization_ratio", "embedstream_gpu_memory_used_bytes"):
        assert text.count(f"# TYPE {name} gauge") == 1, text
