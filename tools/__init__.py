"""Tools around the worker, never imported by it: the local stack (``embedstream dev``), the demo,
the benchmark, fakes and the sample corpora. They live outside the runtime packages: neither in the
wheel nor in the image; a checkout reaches them (``make setup`` puts the checkout on the virtual
environment's path). The runtime path must not import anything from here;
``tests/unit/test_layers.py`` holds that."""
