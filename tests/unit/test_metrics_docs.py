"""docs/metrics.md is what the worker declares: every metric on the page, the page as ``make docs``
writes it, the contract's names among them."""

from __future__ import annotations

from tools.metrics_docs import PAGE, declared, page


def test_the_page_is_what_the_metrics_declare():
    assert PAGE.read_text() == page(), "docs/metrics.md is stale: run `make docs` and commit it"


def test_every_metric_is_on_the_page_once_and_the_contracts_are_declared():
    text = PAGE.read_text()
    names = [name for name, *_ in declared()]
    for name in names:
        assert text.count(f"| `{name}` |") == 1, name
    for name in ("embedstream_build_info", "embedstream_rebalances_total", "embedstream_commit_seconds",
                 "embedstream_commit_failures_total", "embedstream_assigned_partitions",
                 "embedstream_model_load_seconds", "embedstream_consumer_lag", "embedstream_gpu_utilization_ratio"):
        assert name in names, name
