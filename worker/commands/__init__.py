"""The commands (``embedstream <command>``): the CLI and what only a command uses — produce, tail,
search, migrate and their formats. The worker itself is assembled in ``worker.assembly.runner``."""
