"""Assembly: the one place that opens the connectors, loads the models, names the Milvus
collections and builds the chain of steps and the worker around it (``runner.build_worker``,
``chain.build_chain``). Only the commands import it."""
