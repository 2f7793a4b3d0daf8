"""The model's two stages. On the prepare thread: chunk long texts, look up the cache and tokenize
(each model's tokenizer is that thread's alone). On the embed thread, the only one that runs a
model's passes: embed what the cache did not have."""
