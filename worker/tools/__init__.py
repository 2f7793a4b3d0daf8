"""Tools around the worker, never imported by it: the local stack (``embedstream dev``), the demo,
the benchmark and the sample corpora. The runtime path (loop, pipeline, steps, model, connectors,
schemas) must not import anything from here; ``tests/unit/test_layers.py`` holds that."""
