"""Steps on the sink thread: the version guard, record sizes, the output format, and the sink that
writes Milvus, the output and dead-letter topics and the cache."""
