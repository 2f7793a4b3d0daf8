"""Secrets kept out of everything the worker writes: ``config``, ``run --check``, log lines, errors.

Two layers. Settings are masked where they are shown (:func:`is_secret_key` for the properties passed
through to librdkafka and the registry client, :func:`without_userinfo` for URLs). And because a secret
can also reach a line inside someone else's message (a client library's error that quotes the URL it
was given, a traceback), every line the process writes goes through :func:`mask`, which replaces each
secret value the settings hold (:func:`remember`) by ``***``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import unquote

#: Names of properties whose values are secrets: passwords, pass phrases, secrets, tokens, private keys
#: inline (``*.pem``), credentials and user info, OAUTHBEARER's configuration (which holds a secret).
_SECRET_KEY = re.compile(r"pass(word|phrase)|secret|token|\.pem$|oauthbearer\.config|user\.info|credential|"
                         r"private|api\.?key", re.IGNORECASE)
MASK = "***"


def is_secret_key(key: str) -> bool:
    """Whether a property named ``key`` holds a secret (``sasl.password``, ``ssl.key.pem``,
    ``sasl.oauthbearer.config``, ``basic.auth.user.info``, ``bearer.auth.token``, …)."""
    return bool(_SECRET_KEY.search(key))


def _split(url: str) -> tuple[str, str, str]:
    """``(scheme://, user info or "", the rest)`` of one URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    host, at, tail = rest.rpartition("@") if "@" in rest.split("/", 1)[0] else ("", "", rest)
    return (scheme + sep, host, tail) if at else (scheme + sep, "", rest)


def without_userinfo(url: str) -> str:
    """``url`` (or comma-separated URLs) with any ``user:password@`` and secret query parameters
    (``?password=``) masked, for logs and messages."""
    out = []
    for one in url.split(","):
        scheme, info, rest = _split(one)
        out.append(f"{scheme}{MASK}@{rest}" if info else one)
    return _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{MASK}", ",".join(out))


def userinfo(url: str) -> list[str]:
    """The secret parts of ``url`` (or comma-separated URLs): its user info's password (or a lone
    token), and the values of secret query parameters (``?password=``, ``&token=``)."""
    out = []
    for one in url.split(","):
        _, info, rest = _split(one)
        if info:
            user, colon, password = info.partition(":")
            out.append(password if colon else user)
        for m in _QUERY_SECRET.finditer(rest):  # as written, and decoded (a message may quote either)
            out += {m.group(2), unquote(m.group(2))}
    return [s for s in out if s]


def token_parts(token: str) -> list[str]:
    """The secret parts of a credential: itself, and for ``user:password`` (Milvus' token form) the
    password alone, which a server's message may quote without the user."""
    user, colon, password = token.partition(":")
    return [token, password] if colon and password else [token]


_known: set[str] = set()
_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()
#: Values shorter than this are not masked inside text (a one-letter "password" would mask every such
#: letter); they are still never shown as settings.
MIN_MASKED = 4


def remember(secrets: Iterable[str | None]) -> None:
    """Add the values in ``secrets`` to those :func:`mask` replaces (the settings' secrets, once loaded)."""
    global _pattern
    fresh = {s for s in secrets if s and len(s) >= MIN_MASKED} - _known
    if not fresh:
        return
    with _lock:
        _known.update(fresh)
        # longest first: a secret that contains another is masked whole
        _pattern = re.compile("|".join(re.escape(s) for s in sorted(_known, key=len, reverse=True)))


def mask(text: str) -> str:
    """``text`` with every remembered secret, and the user info of any URL in it, replaced by ``***``."""
    if _pattern is not None:
        text = _pattern.sub(MASK, text)
    if "=" in text:
        text = _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text) if "@" in text else text


#: ``scheme://user:password@`` anywhere in a line.
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/@'\"]+@")
#: A secret query parameter of a URL (``?password=…``, ``&token=…``), anywhere in a line.
_QUERY_SECRET = re.compile(r"([?&;](?:[A-Za-z_.\-]*(?:pass(?:word)?|pwd|secret|token|key|credential)[A-Za-z_.\-]*)=)"
                           r"([^&;#\s'\"]+)", re.IGNORECASE)


class MaskingFilter(logging.Filter):
    """A handler's filter that masks its records' text (message and traceback) before any formatter sees
    them (:func:`mask`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask(message)
        if masked != message or record.args:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = mask(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = mask(record.exc_text)
        return True
