"""embedstream: a Kafka-driven streaming embedding worker."""

__version__ = "0.2.0"
