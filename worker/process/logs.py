"""The process's log lines: text, or one JSON object a line (``EMBEDSTREAM_LOG_FORMAT=json``), for
the worker's own lines, librdkafka's (``connectors.kafka.LIBRDKAFKA_LOG``) and what a command says
as it ends (``worker.commands.cli.app.say``)."""

from __future__ import annotations

import datetime
import json
import logging
import sys

from schemas.redact import MaskingFilter, mask, remember
from worker.settings import Settings


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts`` in ISO 8601 with its zone (UTC, milliseconds), level, logger,
    the ``process`` index (which of a pod's ``run --processes N`` wrote it), message, and ``exc``
    where an exception is logged."""

    def __init__(self, process: int = 0) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds")
        out = {"ts": ts, "level": record.levelname, "logger": record.name, "process": self.process,
               "message": record.getMessage()}
        if record.exc_info or record.exc_text:
            # the masked text MaskingFilter left on the record; formatting exc_info again here would
            # print the secrets a traceback holds in clear
            out["exc"] = record.exc_text or mask(self.formatException(record.exc_info))  # type: ignore[arg-type]
        return json.dumps(out)


def setup_logging(settings: Settings) -> None:
    """The process's one handler (text or JSON), which masks every secret the settings hold in every
    line, tracebacks included (``schemas.redact``)."""
    remember(settings.secrets())
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(MaskingFilter())
    handler.setFormatter(JsonFormatter(settings.process_index) if settings.log_format == "json"
                         else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    # httpx2: confluent-kafka's registry client logs every request at INFO (one line per schema id asked).
    for noisy in ("httpx", "httpx2", "httpcore", "urllib3", "sentence_transformers", "transformers", "pymilvus"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def logs_are_json() -> bool:
    """Whether :func:`setup_logging` made this process's lines JSON."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
