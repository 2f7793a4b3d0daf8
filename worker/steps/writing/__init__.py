"""Steps on the sink thread: what a group writes (``planning``: the fence, oversized documents, the
version guard of ``versions``), a model's collection and its rows (``targets``), record sizes
(``fit``), the output format (``output``), and the sink that writes Milvus, the output and
dead-letter topics and the cache (``sink``)."""
