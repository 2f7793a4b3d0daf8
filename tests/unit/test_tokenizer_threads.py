"""Token counting on one thread while the model tokenizes on another must not interfere."""

from __future__ import annotations

import threading

import pytest


@pytest.mark.integration
def test_token_lengths_concurrent_with_embed(model):
    texts = [("word " * (i % 60 + 1)).strip() for i in range(64)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def count():
        try:
            while not stop.is_set():
                model.token_lengths(texts)
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    t = threading.Thread(target=count)
    t.start()
    try:
        for _ in range(6):
            out = model.embed(texts)
            assert out.shape == (64, model.dim)
    finally:
        stop.set()
        t.join()
    assert not errors, errors
