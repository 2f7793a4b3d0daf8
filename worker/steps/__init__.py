"""The steps of the chain, by the thread they run on: ``polling`` (validate, estimate tokens, DLQ
breaker, batch), ``model`` (chunk, embed) and ``writing`` (version guard, sink). The order is
``worker.assembly.chain``."""
