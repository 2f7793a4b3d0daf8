"""embedstream: a Kafka-driven streaming embedding worker."""

__version__ = "0.3.0"
