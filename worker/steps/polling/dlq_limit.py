"""The dead-letter circuit breaker: halt a bad deploy instead of dead-lettering a whole topic.

Its contract: it stops a worker whose own settings, collection or output topic are wrong before it
dead-letters everything, and **a producer alone can never trip it**. So it counts only the reasons
that point at where the worker writes or at its own health (:data:`WORKER_REASONS`: Milvus or the
output topic refusing records that passed every check, records that crashed or stalled the share
group's workers). Every other reason is one that a record's own bytes can cause (a producer's garbage,
its ids, its sizes, its schema, the model it names): those records are dead-lettered at full speed, the
``DeadLetters`` alert fires on their rate, and the breaker does not see them at all (they neither
count against the window nor break a run of worker-pointing ones).

Trips when ``max_consecutive`` records in a row were dead-lettered, or when more than
``max_ratio`` of the last ``window`` records were. The worker then stops without committing
anything it had not finished, so after the fix it resumes at the first unprocessed offset.

Most dead letters are known at intake, on the polling thread, before their record joins a batch.
A few are known only later, on the embed or sink thread (``too_many_chunks``, ``output_too_large``):
those steps report them with :meth:`DlqLimit.record_late` (any thread), and the polling thread counts
them (:meth:`DlqLimit.count_late`) before it takes more records. Their records were counted as
processed at intake; each late one turns the newest processed record of the window into a dead one.
So they weigh on the ratio, not on the run (their neighbours were processed), and a trip halts the
worker before the next records are taken.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from itertools import repeat

from schemas.errors import DlqLimitExceeded

__all__ = ["HINTS", "DlqLimit", "DlqLimitExceeded"]

HINTS = {
    "unknown_model": "is EMBEDSTREAM_MODEL right, or are producers asking for a model this worker does not serve?",
    "decode_error": "are producers writing schemas/document.avsc (or JSON objects)? is EMBEDSTREAM_INPUT_TOPIC "
                    "the right topic?",
    "invalid_utf8": "are producers encoding text as UTF-8?",
    "empty_text": "are producers sending documents without text?",
    "text_too_long": "should EMBEDSTREAM_MAX_TEXT_BYTES be larger?",
    "id_too_long": "are producers using something other than a document id as the id?",
    "id_mismatch": "do producers key each record by its document id (EMBEDSTREAM_KEY_FIELD for a structured key)?",
    "unknown_schema": "is EMBEDSTREAM_SCHEMA_REGISTRY_URL the registry the producers write to?",
    "incompatible_schema": "did the producers' schema drop or retype the id or text field?",
    "too_many_chunks": "are producers sending whole files or logs as one document? raise EMBEDSTREAM_MAX_CHUNKS, "
                       "or split them upstream",
    "output_too_large": "is the documents' metadata larger than the output topic takes? raise its "
                        "max.message.bytes (and EMBEDSTREAM_KAFKA__MESSAGE_MAX_BYTES), or trim the metadata",
    "metadata_too_large": "are producers putting whole documents or blobs into metadata? Milvus takes 64 KB of "
                          "JSON a row: trim it upstream",
    "milvus_rejected": "does the collection still have the shape this worker made (embedstream migrate makes a new "
                       "one)? The dead letters' embedstream.error.message headers carry Milvus' answer.",
    "output_rejected": "does the output topic's configuration (its policy, cleanup, limits) refuse the worker's "
                       "records? The dead letters' messages carry the broker's answer.",
    "delivery_count_exceeded": "do workers of the share group crash or stall on these records, or is Milvus or "
                               "Kafka out for longer than a record's lock?",
}


#: The reasons that point at the worker, not at the record: the only ones the breaker counts.
WORKER_REASONS = frozenset({"milvus_rejected", "output_rejected", "delivery_count_exceeded"})


class DlqLimit:
    """Feed each record's outcome to ``record``; it raises :class:`DlqLimitExceeded` when tripped."""

    def __init__(self, max_consecutive: int, max_ratio: float, window: int) -> None:
        self.max_consecutive = max_consecutive
        self.max_ratio = max_ratio
        self.window = window
        self._run = 0
        self._recent: deque[bool] = deque(maxlen=window)
        self._bad_in_window = 0
        self._reasons: Counter[str] = Counter()
        #: The last message of each reason in the run: the halting line quotes the most frequent's.
        self._messages: dict[str, str] = {}
        self._late: list[tuple[str, str]] = []
        self._late_lock = threading.Lock()

    def record(self, reason: str | None, message: str = "") -> None:
        """``reason`` is the dead-letter reason, or None for a record that will be processed; a reason a
        record alone can cause (not in :data:`WORKER_REASONS`) is not counted."""
        if reason is not None and reason not in WORKER_REASONS:
            return
        bad = reason is not None
        if len(self._recent) == self.window and self._recent[0]:
            self._bad_in_window -= 1
        self._recent.append(bad)
        self._bad_in_window += bad
        if reason is None:
            self._run = 0
            self._reasons.clear()
            self._messages.clear()
            return
        self._run += 1
        self._reasons[reason] += 1
        self._messages[reason] = message
        if self._run >= self.max_consecutive:
            self._trip(f"{self._run} records in a row were dead-lettered")
        if len(self._recent) == self.window and self._bad_in_window > self.max_ratio * self.window:
            self._trip(f"{self._bad_in_window} of the last {self.window} records were dead-lettered")

    def record_processed(self, n: int) -> None:
        """``record(None)`` for ``n`` records that will be processed (they never trip it): at once,
        unless a dead-lettered record may leave the window (then one at a time, to count it out)."""
        if n <= 0:
            return
        if self._bad_in_window:
            for _ in range(n):
                self.record(None)
            return
        self._recent.extend(repeat(False, n))
        self._run = 0
        self._reasons.clear()
        self._messages.clear()

    def record_late(self, reason: str, message: str = "") -> None:
        """A record counted as processed at intake was dead-lettered after all (embed or sink
        thread). Safe from any thread; counted by the polling thread's next :meth:`count_late`."""
        with self._late_lock:
            self._late.append((reason, message))

    def count_late(self) -> None:
        """Count the late dead letters reported since the last call (polling thread): each turns the
        newest processed record of the window into a dead one. Raises :class:`DlqLimitExceeded` when
        the ratio is now over the limit."""
        if not self._late:  # read without the lock: a report missed now is counted next time
            return
        with self._late_lock:
            late, self._late = self._late, []
        for reason, message in late:
            if reason not in WORKER_REASONS:
                continue
            newest_good = next((i for i in range(len(self._recent) - 1, -1, -1) if not self._recent[i]), None)
            if newest_good is not None:
                self._recent[newest_good] = True
                self._bad_in_window += 1
            self._reasons[reason] += 1
            self._messages[reason] = message
        if len(self._recent) == self.window and self._bad_in_window > self.max_ratio * self.window:
            self._trip(f"{self._bad_in_window} of the last {self.window} records were dead-lettered")

    def _trip(self, what: str) -> None:
        """Raise, naming the run's most frequent reason (a trip always follows a dead letter counted
        just now, so there is one) with its last message and hint."""
        reason = self._reasons.most_common(1)[0][0]
        raise DlqLimitExceeded(
            f"halting: {what} (most often {reason}: {self._messages[reason]}). {HINTS.get(reason, '')} "
            "Nothing after the first unprocessed record was committed: fix the cause and restart. "
            "(Limits: EMBEDSTREAM_DLQ_MAX_CONSECUTIVE, EMBEDSTREAM_DLQ_MAX_RATIO.)"
        )
