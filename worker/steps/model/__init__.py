"""Steps on the embed thread, the only one that calls a model: chunk long texts, then embed (cache
lookups included)."""
