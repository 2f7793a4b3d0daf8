"""What ``embedstream config`` shows: each setting in effect, secrets masked, and where it came from."""

from __future__ import annotations

from collections.abc import Mapping

from worker.settings import KAFKA_PREFIX, REGISTRY_PREFIX, Settings

#: The passthrough settings (dicts) and the prefix of their variables.
_PASSTHROUGH = {"kafka": KAFKA_PREFIX, "schema_registry": REGISTRY_PREFIX}


def effective(settings: Settings, environ: Mapping[str, str],
              flags: Mapping[str, object] | None = None) -> list[tuple[str, object, str]]:
    """``(variable, value, source)`` for every setting, in the order of the settings' sections: the
    value as :meth:`Settings.redacted` shows it (secrets masked), the source ``flag`` (given as a
    command-line flag), ``environment`` (its ``EMBEDSTREAM_*`` variable, or for a passthrough any
    variable of its prefix) or ``default``."""
    shown = settings.redacted()
    rows = []
    for name in Settings.model_fields:
        prefix = _PASSTHROUGH.get(name)
        variable = f"{prefix}<PROPERTY>" if prefix else f"EMBEDSTREAM_{name.upper()}"
        if flags and flags.get(name) is not None:
            source = "flag"
        elif (any(k.startswith(prefix) for k in environ) if prefix else f"EMBEDSTREAM_{name.upper()}" in environ):
            source = "environment"
        else:
            source = "default"
        rows.append((variable, shown.get(name), source))
    return rows
