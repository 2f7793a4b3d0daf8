"""GPU utilisation and memory on ``/metrics``, read from NVML (``nvidia-ml-py``) at each scrape.

Registered by the runner when a model runs on CUDA and ``pynvml`` imports; elsewhere nothing is
registered and nothing is imported. Each worker process of a pod exposes the same devices (a
dashboard takes ``max by (gpu)``). Gauges, labelled by the device's index:

* ``embedstream_gpu_utilization_ratio`` — share of the last sample period in which a kernel ran
  (NVML's ``gpu`` utilisation, 0-1);
* ``embedstream_gpu_memory_used_bytes`` / ``embedstream_gpu_memory_total_bytes``.

A device that stops answering (an NVML error at a scrape) is left out of that scrape, never an error.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)


#: The gauges, by name, with what they mean (one series per device, labelled ``gpu``).
GAUGES = {"embedstream_gpu_utilization_ratio": "Share of time a kernel ran on the GPU (NVML)",
          "embedstream_gpu_memory_used_bytes": "GPU memory in use (NVML)",
          "embedstream_gpu_memory_total_bytes": "GPU memory (NVML)"}


class GpuCollector:
    """A Prometheus collector over NVML's devices (``nvml``: the ``pynvml`` module, initialised)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def describe(self) -> list:
        return []  # collected at each scrape: the devices' figures are not known ahead

    def collect(self) -> list:
        util, used, total = (GaugeMetricFamily(name, text, labels=["gpu"]) for name, text in GAUGES.items())
        for index, handle in enumerate(self.handles):
            try:
                rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:  # NVMLError: a device gone or busy; this scrape leaves it out
                log.debug("NVML did not answer for GPU %d: %s", index, exc)
                continue
            util.add_metric([str(index)], rates.gpu / 100.0)
            used.add_metric([str(index)], float(memory.used))
            total.add_metric([str(index)], float(memory.total))
        return [util, used, total]


#: The collector registered in each registry: once a process, however many members it hosts (a live
#: lane and a backfill lane each build theirs on one device).
_REGISTERED: weakref.WeakKeyDictionary[Any, GpuCollector] = weakref.WeakKeyDictionary()


def register_gpu_metrics(device: str, registry=REGISTRY) -> GpuCollector | None:
    """Register the GPU gauges when ``device`` is ``cuda`` and NVML answers; None otherwise. Called
    again (a second member of the process), the collector already registered: each family once on
    ``/metrics``."""
    if device != "cuda":
        return None
    if registry in _REGISTERED:
        return _REGISTERED[registry]
    try:
        import pynvml

        pynvml.nvmlInit()
        collector = GpuCollector(pynvml)
    except Exception as exc:  # no nvidia-ml-py, or no driver: the worker runs without the gauges
        log.warning("GPU gauges off: NVML is not available (%s); `pip install nvidia-ml-py` for them", exc)
        return None
    registry.register(collector)
    _REGISTERED[registry] = collector
    log.info("GPU gauges on for %d devices", len(collector.handles))
    return collector
