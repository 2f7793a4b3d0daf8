"""The process around the worker: metrics and health, GPU gauges, memory (the heap), signals, and
several worker processes in one pod. Its settings are ``worker.settings``, one room below."""
