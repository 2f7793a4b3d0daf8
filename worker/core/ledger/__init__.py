"""Ledgers: what the polling thread does with the input of a batch that has left the pipeline.

One interface (:class:`~worker.core.ledger.base.Ledger`: ``finished``, ``tick``, ``flush``), three
implementations, chosen with the delivery at assembly (``worker.assembly.groups``):

- :class:`OffsetLedger`: a consumer group, at-least-once: the consumer stores and commits offsets;
- :class:`TransactionLedger`: a consumer group, exactly-once: offsets go through transactions;
- :class:`ShareLedger`: a share group: each record acknowledged.

The consumer-group ledgers also answer the group's events (``assigned``, ``revoked``) and prove the
membership after a stall (``prove``). ``worker.core.delivery`` tells the whole commit order.
"""

from worker.core.ledger.base import Ledger
from worker.core.ledger.offsets import OffsetLedger
from worker.core.ledger.share import ShareLedger
from worker.core.ledger.transactions import TransactionLedger

__all__ = ["Ledger", "OffsetLedger", "ShareLedger", "TransactionLedger"]
