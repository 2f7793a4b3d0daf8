"""The write fence: a member that may have lost its partitions writes nothing for them.

A consumer-group member that is frozen (a long GC pause, a stopped container, a stalled VM) or cut
off from the coordinator past ``session.timeout.ms`` is evicted, and another member takes its
partitions over and writes newer versions of the same ids. When the frozen one wakes, its threads
carry on where they stopped: without a fence, the sink would write the batches it had in flight
over the newer versions. Two parts keep it from writing:

* **Ownership.** The polling thread publishes the partitions it owns (``publish``) on every assign,
  revoke (after the in-flight batches of the revoked partitions finished) and loss (at once). The
  sink writes only the entries of owned partitions; the others are left to their new owner (their
  offsets are never committed here).
* **A lease.** A beat thread renews it ten times a second (``beat``); it expires ``lease_s`` after
  the last renewal, and ``lease_s`` is shorter than the time the coordinator needs to evict this
  member and hand its partitions on (``session.timeout.ms`` minus a heartbeat interval, minus a
  margin): the coordinator last heard from a frozen member at most a heartbeat interval before the
  freeze. The clock is the system's boot-time clock, which runs on while the process is stopped or
  the machine is suspended, so whichever thread wakes first finds the lease expired. Ownership alone
  cannot see such a freeze: librdkafka reports the loss only when the polling thread next polls,
  and the sink thread may wake before that.

After a gap longer than the lease between two beats, the lease is not renewed at once: the polling
thread *re-validates* first while the fence stays closed. It polls for ``revalidate_s`` (``tick``):
librdkafka checks its session when it wakes (measured on the local broker: "session timed out …
revoking assignment" logged on waking, ``on_lost`` served by the first poll after it), so an expired
membership shows up as a loss and the lost partitions leave ``owned``. Polling alone is not enough,
though: a member frozen in the middle of a cooperative rebalance saw no loss on waking and learned
of its lost generation only 13 s later, from a refused commit (measured with three members). So the
re-validation ends with a *proof* (``Worker._membership_proven``): the member id is the one its
partitions were assigned under (an evicted member rejoins under a new one), no other member has
committed its partitions past the offsets it stored, and the coordinator accepts a synchronous
commit of the committed offsets from it (Kafka refuses one from an evicted member, an old
generation, or during a rebalance; the local Tansu accepted it, which is why the offsets are
compared too). Without the proof, the loop polls on and asks again; the rebalance's revoke or loss
reaches ``owned`` first.

The producer's ``message.timeout.ms`` is at most the lease (see ``worker.assembly.runner``): records already
handed to librdkafka when the process froze are then timed out on waking instead of being sent after
the new owner's (measured: 10 of 10 queued records timed out after an 8 s freeze with a 3 s timeout;
all 10 were sent with 30 s). The sink asks the fence before it reads the versions Milvus holds and
again once it has them (``worker.steps.writing.planning``): a member frozen, or cut off and re-validated,
while its read was on the way gets an answer older than what the new owner has written since, and
only the fence can tell. What remains is the instant between the sink's last check and its request
reaching the socket.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable

from schemas.errors import TransientError
from worker.core.records import Batch, TopicPartitionKey

log = logging.getLogger(__name__)


def boot_clock() -> float:
    """Seconds on a clock that also runs while the process is stopped or the machine suspended."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def lease_seconds(session_timeout_s: float, heartbeat_interval_s: float) -> float:
    """The longest a member may go without renewing its lease and still write: the session
    timeout minus one heartbeat interval (the coordinator may have heard from it last that long
    before it froze), minus a second of margin; at least one second."""
    return max(1.0, session_timeout_s - heartbeat_interval_s - 1.0)


class FenceClosed(TransientError):
    """The lease has expired: no write until the polling thread has re-validated the membership.
    Retried like an outage (the sink's stage retries the same group with backoff)."""

    def __init__(self, message: str) -> None:
        super().__init__("fence", message)


class Fence:
    """Shared by its own beat thread (``beat``), the polling thread (``tick``, ``publish``) and the
    sink (``owned_now``, ``check``).

    The lease is renewed by a small thread every ``beat_s`` rather than by the polling loop: the loop
    legitimately blocks for seconds at a time (a synchronous commit waits out the broker's JoinGroup,
    measured ~3 s on Tansu, while heartbeats go on), and that is no sign of a lost membership; a
    frozen process stops every thread, the beat thread included. Reads and writes of the attributes
    the threads share are single reference assignments."""

    def __init__(self, lease_s: float, revalidate_s: float = 2.0, clock: Callable[[], float] = boot_clock,
                 beat_s: float = 0.1) -> None:
        self.lease_s = lease_s
        self.revalidate_s = revalidate_s
        self.beat_s = beat_s
        self._clock = clock
        self._renewed = clock()
        self._last_beat = self._renewed
        self._suspect_since: float | None = None
        self._revalidating_since: float | None = None
        self._owned: frozenset[TopicPartitionKey] = frozenset()
        #: Per owned partition, its tenure: a number drawn when this member was given it.
        self._tenures: dict[TopicPartitionKey, int] = {}
        self._tenure_counter = itertools.count(1)
        #: A share member's: the clock's time past which the records in flight are no longer its own
        #: (their lock ran out, and the group hands them to another member); None: no such bound.
        self._locked_until: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start renewing the lease (a daemon thread); ``stop`` ends it."""
        def run() -> None:
            while not self._stop.wait(self.beat_s):
                self.beat()

        self._renewed = self._last_beat = self._clock()  # the time since construction was no stall

        self._thread = threading.Thread(target=run, name="fence-beat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    # -- the beat thread ---------------------------------------------------------------------
    def beat(self) -> None:
        """Renew the lease; after a gap longer than the lease (the process was frozen), close it
        until the polling thread has re-validated the membership."""
        now = self._clock()
        if self._suspect_since is None and now - self._last_beat > self.lease_s:
            self._suspect_since = now
            log.warning("this process stalled for %.1fs (longer than the %.1fs lease): no writes until the "
                        "group membership is re-validated", now - self._last_beat, self.lease_s)
        self._last_beat = now
        if self._suspect_since is None:
            self._renewed = now

    # -- the polling thread -------------------------------------------------------------------
    def tick(self, prove: Callable[[], bool] | None = None) -> None:
        """One turn of the polling loop (each turn polls the consumer, which serves a loss). After a
        stall, ``revalidate_s`` of turns pass, then ``prove()`` must show the membership is current
        (a commit the coordinator accepts for this generation); only then does the lease renew. A
        failed proof starts another window of turns: a rebalance in progress ends in an assign,
        revoke or loss that the turns serve, and the proof is asked again."""
        if self._suspect_since is None:
            return
        now = self._clock()
        if self._revalidating_since is None:
            self._revalidating_since = now
            return
        if now - self._revalidating_since < self.revalidate_s:
            return
        if prove is not None and not prove():
            log.warning("group membership not proven yet: still no writes, polling on")
            self._revalidating_since = self._clock()
            return
        self._suspect_since = self._revalidating_since = None
        self._renewed = self._clock()
        log.info("group membership re-validated: writes resume for %s", sorted(p for _, p in self._owned))

    @property
    def suspect(self) -> bool:
        """The lease lapsed and the membership is not re-validated yet."""
        return self._suspect_since is not None

    def publish(self, partitions: Iterable[TopicPartitionKey]) -> None:
        """The partitions this member owns now. A partition that was not owned a moment ago (newly
        assigned, or lost or revoked and given back) starts a new tenure; one still owned keeps its own."""
        before = self._tenures
        now = {tp: before.get(tp) or next(self._tenure_counter) for tp in partitions}
        self._tenures = now
        self._owned = frozenset(now)

    def stamp(self, batch: Batch) -> Batch:
        """Record in ``batch`` the tenure under which its records were read (the polling thread, as
        it hands the batch on): the sink writes a partition's records only in that same tenure."""
        tenures = self._tenures
        batch.tenure = {tp: tenures[tp] for tp in batch.offsets if tp in tenures}
        return batch

    def lock(self, seconds: float | None) -> None:
        """A share member's records, just polled, are locked to it for ``seconds`` (None: for as long
        as it takes); past that, ``stale`` gives every partition of a batch."""
        self._locked_until = None if seconds is None else self._clock() + seconds

    # -- the sink -----------------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`FenceClosed` if the lease has expired. Cheap: call it before every write."""
        age = self._clock() - self._renewed
        if age > self.lease_s:
            raise FenceClosed(f"lease expired {age:.1f}s after the last renewal (lease {self.lease_s:.1f}s): "
                              "this member may have lost its partitions")

    def owned_now(self) -> frozenset[TopicPartitionKey]:
        """The partitions writes may go to now; raises :class:`FenceClosed` when the lease expired."""
        self.check()
        return self._owned

    def stale(self, batch: Batch) -> set[TopicPartitionKey]:
        """The partitions of ``batch`` whose records may not be written now: not owned, or owned in
        another tenure than the batch was read in (lost and assigned again meanwhile: the consumer
        reads them again from the committed offset, so writing these too would repeat them, and
        under exactly-once commit the older offsets after the newer ones). Raises
        :class:`FenceClosed` when the lease expired. A share member's batch is stale whole once its
        records' lock ran out (``lock``): another member has them, and may have written newer versions."""
        self.check()
        locked_until = self._locked_until
        if locked_until is not None and self._clock() > locked_until:
            return set(batch.offsets)
        tenures = self._tenures
        if batch.tenure is None:  # a batch never stamped (built by hand): ownership alone
            return {tp for tp in batch.offsets if tp not in tenures}
        return {tp for tp in batch.offsets if tenures.get(tp) is None or tenures.get(tp) != batch.tenure.get(tp)}
