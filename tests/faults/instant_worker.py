"""``embedstream run`` with an instant model in place of the one it would load: for a test that
measures the worker around the model (``WorkerProcess(..., instant=True)``).

The model is ``tools.fake_embedder.FakeEmbedder`` (384 dimensions, vectors from each text's digest,
no time spent). What the real model's runtime does with memory depends on the shapes of the batches
it is given (OpenVINO keeps compiled kernels for up to 64 input shapes, megabytes each): a flood in
which one record in a hundred is a document makes batches of shapes a clean stream never makes, and
that memory would be counted against the flood. Everything else is the worker of ``embedstream run``:
its command line, settings, brokers, Milvus, Redis and exit codes.

``python -m tests.faults.instant_worker run [embedstream's options]``
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import worker.assembly.runner as runner
    from tools.fake_embedder import FakeEmbedder
    from worker.commands.cli import main as embedstream

    build = runner.build_worker

    def with_an_instant_model(settings, embedder=None, **kw):
        return build(settings, embedder or FakeEmbedder(384, "instant-model"), **kw)

    runner.build_worker = with_an_instant_model  # the command imports it at the call
    sys.argv = ["embedstream", *sys.argv[1:]]
    embedstream()


if __name__ == "__main__":
    main()
