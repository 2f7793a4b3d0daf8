"""The three kinds of failure, as types (see ``docs``: retry, dead-letter, crash).

* :class:`TransientError` — an outage or timeout of an outside system. The same work is retried
  with backoff; nothing is committed and nothing is dead-lettered meanwhile.
* ``schemas.DecodeError`` and :class:`InvalidRecord` — a record that can never succeed; it goes to
  the dead-letter topic with its reason.
* :class:`ConfigError` — a wrong setting found at start-up; the message says what to fix.

Anything else is a bug and crashes the worker with a traceback.
"""

from __future__ import annotations


class TransientError(RuntimeError):
    """An outside system failed or timed out; retrying the same call later may succeed."""

    def __init__(self, system: str, message: str) -> None:
        super().__init__(f"{system}: {message}")
        self.system = system


class InvalidRecord(ValueError):
    """A decoded record that can never be embedded (empty text, too long, unknown model)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ConfigError(RuntimeError):
    """A setting is wrong; raised at start-up with a message that says what to fix."""
