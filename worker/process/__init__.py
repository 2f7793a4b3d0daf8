"""The process around the worker: its settings, metrics and health, GPU gauges, memory (the heap),
signals, and several worker processes in one pod."""
