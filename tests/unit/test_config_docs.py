"""docs/configuration.md is what the settings declare: every setting on the page, the page as
``make docs`` writes it."""

from __future__ import annotations

from tools.config_docs import PAGE, page
from worker.settings import Settings


def test_the_page_is_what_the_settings_declare():
    assert PAGE.read_text() == page(), "docs/configuration.md is stale: run `make docs` and commit it"


def test_every_setting_is_on_the_page_once():
    text = PAGE.read_text()
    for name, field in Settings.model_fields.items():
        variable = f"`EMBEDSTREAM_{name.upper()}" + ("__<PROPERTY>`" if field.default_factory is dict else "`")
        assert text.count(f"| {variable} |") == 1, variable
