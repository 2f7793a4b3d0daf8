"""A worker process started before a test needs it (``tests.faults.harness.WorkerProcess``).

``python -m tests.faults.warm_worker`` imports what a worker's start needs before its model (the
connectors, the command line, and the int8 path without torch, ``worker.embedding.lite``: about 2 s
of CPU on this project's 2-core host), and waits on stdin for one line of JSON: ``argv``,
``env``, ``cwd`` and ``log`` (or ``stdout`` and ``stderr``, two files). Once both are done it points
its stdout and stderr at the log (or at those two), takes
the environment as it is given, and runs ``embedstream`` (``worker.commands.cli.main``) with that
command line: from there on it is the worker a cold start would be, in the process the test started
(its pid, its exit status, its signals). The model, the settings and the connections are all made
after the request, so nothing of a test reaches the worker of another.

Until a request comes, the process runs niced (where it may take its priority back: as root), so
that preparing the next worker takes CPU from no scenario that is running; the request restores the
priority at once, even in the middle of the imports. A closed stdin (the session ended) ends it.

Torch, transformers and sentence-transformers are not imported ahead: most of the suite's workers
load the cached int8 export without them, and importing them took about 8 s of CPU a process (of
some 200 a suite), which the tests beside it paid for on a 2-core host. A worker that needs them (a
first export, another precision, a prompt, a learned sparse model) imports them itself, as a cold
start does.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading


def _unnice() -> None:
    """Priority 0 for every thread (on Linux a priority is a thread's, and the imports start some)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), 0)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def main() -> None:
    # What ``worker.commands.cli.main`` sets before anything is imported (read by the libraries at import).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    niced = os.geteuid() == 0
    if niced:
        os.nice(10)
    requests: list[str] = []
    arrived = threading.Event()

    def read() -> None:
        requests.append(sys.stdin.readline())
        if niced:
            _unnice()
        arrived.set()

    threading.Thread(target=read, daemon=True).start()
    import worker.assembly.runner  # noqa: F401  (the connectors: pymilvus, confluent-kafka, redis)
    import worker.commands.cli as cli
    import worker.embedding.lite  # noqa: F401  (the int8 path without torch)

    arrived.wait()
    if not requests[0]:
        return
    if niced:
        _unnice()  # threads the imports started after the request came
    request = json.loads(requests[0])
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, path in ((1, request.get("stdout", request["log"])), (2, request.get("stderr", request["log"]))):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, fd)
        os.close(out)
    # a test that gives up on it sends SIGABRT (tests.faults.harness.dump_stacks): every thread's stack to its log
    faulthandler.enable(all_threads=True)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = request["argv"]
    cli.main()


if __name__ == "__main__":
    main()
