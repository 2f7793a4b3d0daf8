"""librdkafka's mock cluster (inside the confluent-kafka wheel), driven through ctypes.

A Kafka-protocol cluster with correct ListOffsets and with fault injection (brokers down,
request errors): the tests use it where the local Tansu broker is wrong (ListOffsets) or cannot be
faulted. ``python -m tools.mock_broker --addr-file F`` runs one as a process of its own
(``embedstream dev up --broker mock``): the broker of the local stack where Tansu cannot go, such
as the GPU machine of ``make bench-gpu``. It keeps everything in memory and dies with its process.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import signal
import threading
from pathlib import Path

import confluent_kafka

_RD_KAFKA_PRODUCER = 0


def _lib() -> ctypes.CDLL:
    libdir = os.path.join(os.path.dirname(confluent_kafka.__file__), os.pardir, "confluent_kafka.libs")
    found = glob.glob(os.path.join(libdir, "librdkafka*.so*"))
    if not found:
        raise RuntimeError("librdkafka not found inside the confluent-kafka wheel")
    lib = ctypes.CDLL(found[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [ctypes.c_void_p, ctypes.c_int16, ctypes.c_size_t,
                                                             ctypes.POINTER(ctypes.c_int)]
    lib.rd_kafka_mock_broker_set_down.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_up.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_set_controller_id.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    return lib


class MockCluster:
    """``with MockCluster(brokers=1) as mc: mc.bootstraps ...``; brokers are numbered from 1."""

    def __init__(self, brokers: int = 1) -> None:
        self._lib = _lib()
        err = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"0", err, 512)
        self._rk = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, err, 512)
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new: {err.value.decode()}")
        self._mc = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        # It reports controller 0 while its brokers are numbered from 1, so an admin client's
        # CreateTopics waits for a controller forever ("Failed while waiting for controller").
        self._lib.rd_kafka_mock_set_controller_id(self._mc, 1)
        self.bootstraps = self._lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode()

    def create_topic(self, name: str, partitions: int) -> None:
        rc = self._lib.rd_kafka_mock_topic_create(self._mc, name.encode(), partitions, 1)
        if rc != 0:
            raise RuntimeError(f"mock topic create failed: {rc}")

    def push_request_errors(self, api_key: int, errors: list[int]) -> None:
        """The next ``len(errors)`` requests of ``api_key`` (0 = Produce) fail with these error codes."""
        arr = (ctypes.c_int * len(errors))(*errors)
        self._lib.rd_kafka_mock_push_request_errors_array(self._mc, api_key, len(errors), arr)

    def broker_down(self, broker_id: int = 1) -> None:
        self._lib.rd_kafka_mock_broker_set_down(self._mc, broker_id)

    def broker_up(self, broker_id: int = 1) -> None:
        self._lib.rd_kafka_mock_broker_set_up(self._mc, broker_id)

    def close(self) -> None:
        if self._mc:
            self._lib.rd_kafka_mock_cluster_destroy(self._mc)
            self._mc = None
        if self._rk:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    """Run a mock cluster until SIGTERM/SIGINT; its bootstrap address is written to ``--addr-file``
    (atomically, once it listens), since librdkafka picks the brokers' ports itself."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr-file", required=True, type=Path)
    ap.add_argument("--brokers", type=int, default=1)
    args = ap.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with MockCluster(args.brokers) as mc:
        tmp = args.addr_file.with_suffix(".tmp")
        tmp.write_text(mc.bootstraps)
        tmp.replace(args.addr_file)
        print(f"mock cluster on {mc.bootstraps}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
