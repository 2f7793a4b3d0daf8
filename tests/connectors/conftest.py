"""One contract test per connector, run against a fake (always, fast) and against the real server
of the local stack (``integration``). Each test takes ``kind`` = ``fake`` or ``real``."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.integration)])
def kind(request) -> str:
    return request.param


@pytest.fixture()
def stack_env(kind, request):
    """The local stack's env for ``real``; None for ``fake`` (no stack started)."""
    return request.getfixturevalue("stack") if kind == "real" else None
