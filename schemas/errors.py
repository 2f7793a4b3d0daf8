"""The three kinds of failure, as types, shared by every layer.

``schemas`` is the bottom layer (it imports nothing of ours), so the connectors, the model and the
worker all import these without crossing a layer (style.md: retry, dead-letter, crash).

* :class:`TransientError` — an outage or timeout of an outside system. The same work is retried
  with backoff; nothing is committed and nothing is dead-lettered meanwhile.
* :class:`DecodeError` — a record that can never succeed; it goes to the dead-letter topic with
  its ``reason`` (a dead-letter reason of the contract).
* :class:`ConfigError` — a wrong setting found at start-up; the message says what to fix.
* :class:`DlqLimitExceeded` — so many records are dead-lettered that a deploy or a producer is
  probably wrong; the worker halts and says what to check.
* :class:`Refused` — an outside system answered that it will never take this piece of work (Milvus
  refusing a row's value, say): retrying cannot change it. The worker finds the records that cause it
  and dead-letters them; the rest are written.
* :class:`RecordRefused` — the broker refuses a record of ours for a reason that retrying cannot
  change (its size, the topic's policy); the worker stops with a one-line message that says what
  to fix, and resumes at that record once it is fixed.

Anything else is a bug and crashes the worker with a traceback.
"""

from __future__ import annotations


class TransientError(RuntimeError):
    """An outside system failed or timed out; retrying the same call later may succeed."""

    def __init__(self, system: str, message: str) -> None:
        super().__init__(f"{system}: {message}")
        self.system = system


class Refused(RuntimeError):
    """An outside system refused the work it was given for good (its content, not the system's state):
    the same call would be refused again. ``message`` is the system's own answer."""

    def __init__(self, system: str, message: str) -> None:
        super().__init__(f"{system} refused: {message}")
        self.system = system
        self.message = message


class DecodeError(ValueError):
    """A record that can never be decoded. ``reason`` is a dead-letter reason of the contract
    (``decode_error`` or ``invalid_utf8``); ``str(err)`` says what was wrong."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ConfigError(RuntimeError):
    """A setting is wrong; raised at start-up with a message that says what to fix."""


class AccessRefused(ConfigError):
    """The broker refused this principal an operation it needs (an ACL is missing): not an outage, and
    no record's fault. The worker stops with one line naming the operation (exit 2)."""


class RecordRefused(RuntimeError):
    """The broker refused a record for good; ``str(err)`` names it and says what to do."""


class DlqLimitExceeded(RuntimeError):
    """Too many records are being dead-lettered (``worker.steps.polling.dlq_limit``): probably a
    configuration or producer bug. The worker halts, committing nothing past the first unprocessed
    record; the message names the likely cause."""
