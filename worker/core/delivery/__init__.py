"""Delivery: how a group's writes and its input offsets become durable, and in what order.

The sink thread's half is one interface (:class:`~worker.core.delivery.base.Delivery`), two
implementations; the polling thread's half is the ledger (``worker.core.ledger``), three
implementations. Both are chosen once, together, at assembly (``worker.assembly.groups``, from
``EMBEDSTREAM_DELIVERY`` and ``EMBEDSTREAM_GROUP_TYPE``); nothing else asks which one runs. This
docstring is the one place the commit order is told.

For each group of batches, on the sink thread (``worker.steps.writing.sink.SinkStep.process`` writes it,
one way for both deliveries; the delivery hands it an :class:`~worker.core.delivery.base.Attempt` that
says what each mode does at each step):

1. **Fence.** The entries of partitions this member no longer owns are left out (their new owner
   redoes them, and their offsets are not committed here); a lease past its end stops the write
   before each step and before each output record (``worker.core.fence``: the loop renews the lease
   while the group's member proves itself alive, and a member that stalled past its session must
   prove its membership, a commit the group accepts, before it writes again).
2. **Version guard.** Milvus is asked which versions it holds for the group's ids (one Strong
   read); an operation older than the row's from the same partition is written nowhere
   (``worker.steps.writing.versions``).
3. **Milvus and the topics, side by side.** Milvus' upserts and deletes run on a helper thread
   while the output and dead-letter records are handed to the producer; both must be acknowledged
   before the group counts as written. An outage raises ``TransientError`` and the group is retried
   whole: Milvus' writes are idempotent.

   - *at-least-once* (:class:`AtLeastOnce`): the idempotent producer; records an earlier attempt
     had delivered are not produced again when only Milvus failed. A producer fenced or broken is
     replaced before the retry.
   - *exactly-once* (:class:`ExactlyOnce`): the group is one Kafka transaction, begun before its
     first record. A Milvus outage keeps the transaction open (the retry writes Milvus alone) for
     at most half the transaction timeout; any other failure aborts it and the group is redone.
4. **Offsets.**

   - *at-least-once* (:class:`~worker.core.ledger.OffsetLedger`): when the group leaves the
     pipeline, the polling thread stores its next offsets in the consumer (for partitions it still
     owns) and commits them every ``EMBEDSTREAM_COMMIT_INTERVAL_MS``, synchronously on a revoke and
     at a stop.
   - *exactly-once*: the sink sends the group's offsets to the transaction and commits it, under the
     transactions' lock, after checking that it still owns their partitions. A revoke publishes
     the smaller ownership, then takes that lock once (``barrier``): no transaction commits offsets
     of a partition given away. Each batch carries the offsets its transaction committed to the
     polling thread (``Written.committed``); what that thread stores past them (a drained partition's
     end past a commit marker) is committed by a transaction of offsets alone
     (:class:`~worker.core.ledger.TransactionLedger`).
   - *share group* (:class:`~worker.core.ledger.ShareLedger`): records go out as at-least-once's
     do; when the group leaves the pipeline, the polling thread acknowledges each of its input records
     (``worker.core.share_loop``) and sends the acknowledgements; there are no offsets.
"""

from worker.core.delivery.at_least_once import AtLeastOnce
from worker.core.delivery.base import Attempt, Delivery, Planned, written_offsets
from worker.core.delivery.exactly_once import ExactlyOnce

__all__ = ["AtLeastOnce", "Attempt", "Delivery", "ExactlyOnce", "Planned", "written_offsets"]
