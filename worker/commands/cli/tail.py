"""``embedstream tail``: the output topic as JSON lines."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from worker.commands import options as opt
from worker.commands.cli.app import (
    app,
    fail,
    require_or_exit,
    settings_or_exit,
)


@app.command()
@opt.with_settings("kafka_bootstrap_servers", "output_topic", "schema_registry_url")
def tail(
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at the oldest record "
                                                 "(default: only new records)")] = False,
    max_records: Annotated[int | None, typer.Option("--max", help="Stop after N records", min=1)] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop when no record came for this many seconds")] = None,
    vectors: Annotated[bool, typer.Option(help="Include the vectors in the output")] = True,
    output_format: Annotated[str | None, typer.Option(
        "--format", help="avro|avro-registry|json: how the values are written [env: EMBEDSTREAM_OUTPUT_FORMAT; "
        "default: avro]")] = None,
    read_uncommitted: Annotated[bool, typer.Option(
        "--read-uncommitted", help="Also show records of open and aborted transactions (default: committed "
        "records only, as a read_committed consumer sees them)")] = False,
    overrides: dict[str, object] | None = None,
) -> None:
    """Print the output topic as JSON lines (tombstones as {"id", "tombstone": true}).

    With --format avro-registry the values are read by confluent-kafka's AvroDeserializer with
    nothing but the registry's URL, as any consumer of the topic would."""
    from worker.commands.tail import tail_records, to_json_line
    from worker.commands.wire import embedding_decoder

    s = settings_or_exit(overrides)
    require_or_exit(s, "kafka_bootstrap_servers")
    try:
        decode = embedding_decoder(output_format or s.output_format, s)
        for record in tail_records(s, from_beginning=from_beginning, max_records=max_records, timeout=timeout,
                                   decode=decode, read_committed=not read_uncommitted):
            sys.stdout.write(to_json_line(record, vectors) + "\n")
            sys.stdout.flush()
    except (ValueError, RuntimeError) as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        pass
