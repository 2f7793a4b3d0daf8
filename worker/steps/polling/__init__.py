"""Steps on the polling thread (``intake``): validate each record, estimate its tokens, feed the DLQ
breaker, batch."""
