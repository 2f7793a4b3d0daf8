"""``python -m worker.commands.cli``: the ``embedstream`` command."""

from worker.commands.cli import main

main()
