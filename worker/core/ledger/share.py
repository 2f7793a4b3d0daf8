"""A share group's ledger (``EMBEDSTREAM_GROUP_TYPE=share``, KIP-932): the input is acknowledged record
by record instead of committed by offset.

A record is acknowledged ACCEPT once its batch has left the pipeline: its output records (or its
dead letter) acknowledged by the broker and its Milvus writes done (``worker.core.delivery`` tells
that order). A share member may be handed records of every partition of the topic (those added since
it started too), but only for as long as they are locked to it: once a poll's lock has run out, the
group hands its records to another member, which may write newer versions of them, so the fence
makes them stale and the sink writes none (``worker.core.fence``). Those records (``Written.fenced``)
are RELEASEd, never accepted unwritten (the broker refuses either once the lock is gone). What is
acknowledged goes to the broker with the next :meth:`ShareLedger.flush` (the share consumer sends
acknowledgements with its commits and polls); a record never acknowledged (a crash, a stop before
its batch finished) goes back to the group when its lock expires or its member leaves, and is
delivered again, its delivery count one higher.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaException

from schemas.errors import TransientError
from worker.core.ledger.base import Ledger
from worker.core.records import Batch, Written
from worker.process.metrics import SHARE_ACKNOWLEDGEMENTS

log = logging.getLogger(__name__)


class ShareLedger(Ledger):
    """The acknowledgements of a share-group member, through its share consumer
    (``confluent_kafka.ShareConsumer``), which sends them with its commits and polls."""

    def __init__(self, share: Any, timeout_s: float) -> None:
        self.share = share
        self.timeout_s = timeout_s
        self._unsent = 0
        self._accepted = SHARE_ACKNOWLEDGEMENTS.labels("accept")
        self._released = SHARE_ACKNOWLEDGEMENTS.labels("release")
        SHARE_ACKNOWLEDGEMENTS.labels("reject")  # exported at 0: this worker dead-letters instead of rejecting

    def finished(self, batch: Batch, written: Written) -> int:
        """Acknowledge every record of ``batch``: ACCEPT, or RELEASE for a partition the sink left
        unwritten (``written.fenced``). Returns how many were released."""
        released = 0
        for e in batch.entries:
            src = e.source
            kind = AcknowledgeType.RELEASE if src.tp in written.fenced else AcknowledgeType.ACCEPT
            released += kind == AcknowledgeType.RELEASE
            self.share.acknowledge_offset(src.topic, src.partition, src.offset, kind)
        self._unsent += len(batch.entries)
        self._accepted.inc(len(batch.entries) - released)
        self._released.inc(released)
        return released

    def tick(self) -> None:
        """Send the acknowledgements made since the last call, without waiting for the answer."""
        if self._unsent:
            self.flush(sync=False)

    def _send(self, sync: bool) -> bool:
        """Send the acknowledgements made since the last call; with ``sync``, wait for the broker's
        answer (a refused acknowledgement is logged: its record comes back, to this member or
        another). True when nothing is left to send."""
        if not self._unsent:
            return True
        try:
            if sync:
                answers = self.share.commit_sync(self.timeout_s)
                refused = {tp: exc for tp, exc in answers.items() if exc is not None}
                if refused:
                    log.warning("the broker refused acknowledgements of %s: those records are delivered again",
                                sorted(f"{tp.topic}[{tp.partition}]" for tp in refused))
            else:
                self.share.commit_async()
        except KafkaException as exc:
            raise TransientError("kafka", f"acknowledging records: {exc}") from None
        self._unsent = 0
        return True
