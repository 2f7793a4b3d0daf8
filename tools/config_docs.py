"""``docs/configuration.md``, generated from the settings' own declarations (``worker.settings``):
each setting's variable, flag, default and meaning, by section, then the passthroughs and what the
worker refuses. ``make docs`` writes it; ``tests/unit/test_config_docs.py`` fails when the page and
the code differ. Run: ``python -m tools.config_docs [--check]``."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic.fields import FieldInfo

from tools.generated_page import page_main
from worker.settings import (
    GUARDED_KAFKA,
    GUARDED_KAFKA_EXACTLY_ONCE,
    KAFKA_PREFIX,
    REGISTRY_PREFIX,
    SECTIONS,
)

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "(none)"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def page() -> str:
    """The whole page, as ``docs/configuration.md`` must read."""
    out = ["# Configuration", "",
           "Generated from `worker/settings.py` by `make docs` (a test fails when the two differ): edit the "
           "declarations there, not this page.", "",
           "Every setting is read from its `EMBEDSTREAM_<NAME>` variable; those marked with a flag are also taken "
           "by the commands as `--<name>`. A misspelt `EMBEDSTREAM_*` variable, a bad value, or a guarded property "
           "stops the worker at start-up with one line naming it and exit code 2.", ""]
    for section in SECTIONS:
        title = (section.__doc__ or section.__name__).strip().splitlines()[0].rstrip(".")
        out += [f"## {section.__name__.removesuffix('Settings')}: {title[0].lower() + title[1:]}", "",
                "| variable | flag | default | meaning |", "|---|---|---|---|"]
        for name, field in section.model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            flag = f"`--{name.replace('_', '-')}`" if extra.get("flag") else ""
            variable = f"EMBEDSTREAM_{name.upper()}" + ("__<PROPERTY>" if field.default_factory is dict else "")
            out.append(f"| `{variable}` | {flag} | {_cell(_default(field))} | "
                       f"{_cell(field.description or '')} |")
        out.append("")
    out += ["## Client properties passed through", "",
            f"- **librdkafka**: any property as `{KAFKA_PREFIX}<NAME>`, dots as `_` "
            f"(`{KAFKA_PREFIX}SASL_MECHANISM=PLAIN` is `sasl.mechanism=PLAIN`).",
            f"- **Schema registry client**: any property as `{REGISTRY_PREFIX}<NAME>`, dots as `_` "
            f"(`{REGISTRY_PREFIX}BASIC_AUTH_USER_INFO=user:secret`).", "",
            "Secrets are never printed: `config` and `run --check` show a property whose name holds `password`, "
            "`passphrase`, `secret`, `token`, `credential`, `private`, `api.key` or `user.info`, ends in `.pem`, "
            "or is `sasl.oauthbearer.config` as `***`, and every URL setting without its `user:password@`; every "
            "log line and error line has each such value, wherever it appears, replaced by `***`.", "",
            "## Properties the worker refuses through the passthrough", "",
            "The worker's guarantees rest on these; set to anything but the worker's own value, start-up stops "
            "with one line naming the guarantee (exit 2).", "",
            "| property | the worker's value | in | the guarantee |", "|---|---|---|---|"]
    for guarded, mode in ((GUARDED_KAFKA, "every mode"), (GUARDED_KAFKA_EXACTLY_ONCE, "exactly-once")):
        for prop, (value, why) in guarded.items():
            out.append(f"| `{prop}` | {f'`{value}`' if value is not None else 'derived: never set it'} | {mode} | "
                       f"{_cell(why)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    return page_main(PAGE, page, "Write docs/configuration.md from worker/settings.py", argv)


if __name__ == "__main__":
    sys.exit(main())
