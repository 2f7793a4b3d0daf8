"""Clients of the outside systems: Kafka, Redis (cache) and Milvus (vector store)."""
