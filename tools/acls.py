"""The Kafka ACLs each mode of the worker needs, as data: ``docs/operations.md`` shows this table, and
``tests/integration/test_secured_kafka.py`` grants exactly these to a principal on Apache Kafka with its
authorizer and runs each mode end to end (and each mode without one of them, for the line that names it);
the backfill lane's row is what a worker with one needs besides its mode's, and is not run there.

Names are written with the settings they come from: ``{input}``, ``{output}``, ``{dlq}``, ``{group}``
(``EMBEDSTREAM_GROUP_ID``). Read and Write imply Describe on Kafka, so Describe is listed only where
nothing implies it.
"""

from __future__ import annotations

from typing import NamedTuple


class Acl(NamedTuple):
    resource: str  #: TOPIC, GROUP, TRANSACTIONAL_ID
    name: str  #: with ``{input}``-style placeholders
    operation: str  #: READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS
    prefixed: bool = False  #: a prefix pattern (every name that starts with ``name``)
    why: str = ""

    def named(self, **names: str) -> Acl:
        return self._replace(name=self.name.format(**names))


_OUTPUTS = (
    Acl("TOPIC", "{output}", "WRITE", why="embeddings and tombstones"),
    Acl("TOPIC", "{dlq}", "WRITE", why="dead letters"),
    Acl("TOPIC", "{output}", "DESCRIBE_CONFIGS", why="its max.message.bytes, to fit records to it (without it: "
                                                     "a warning, and the producer's limit alone)"),
    Acl("TOPIC", "{dlq}", "DESCRIBE_CONFIGS", why="the same for dead letters"),
)

#: mode → the ACLs it needs.
ACLS: dict[str, tuple[Acl, ...]] = {
    "at-least-once": (
        Acl("TOPIC", "{input}", "READ", why="the documents"),
        Acl("GROUP", "{group}", "READ", why="join the group, commit its offsets"),
        *_OUTPUTS,
    ),
    "exactly-once": (
        Acl("TOPIC", "{input}", "READ", why="the documents (read_committed)"),
        Acl("GROUP", "{group}", "READ", why="join the group; offsets committed inside each transaction"),
        *_OUTPUTS,
        Acl("TRANSACTIONAL_ID", "embedstream-{group}-", "WRITE", prefixed=True,
            why="each worker's transactional.id, embedstream-<group>-<member>"),
    ),
    "share group": (
        Acl("TOPIC", "{input}", "READ", why="the documents"),
        Acl("GROUP", "{group}", "READ", why="join the share group, acknowledge records"),
        Acl("GROUP", "{group}", "DESCRIBE_CONFIGS", why="read share.auto.offset.reset at start-up"),
        Acl("GROUP", "{group}", "ALTER_CONFIGS", why="set it to earliest on a new group (without it a new group "
                                                      "starts at the topic's end, and says so)"),
        *_OUTPUTS,
    ),
    # Besides its mode's: not run under the authorizer by the suite (the lane's group is migrate's).
    "backfill lane": (
        Acl("GROUP", "{group}.migrate.", "READ", prefixed=True, why="besides its mode's: the lane's group, "
                                                                   "<group>.migrate.<new collection>"),
    ),
    "lag": (
        Acl("TOPIC", "{input}", "DESCRIBE", why="its partitions and end offsets"),
        Acl("GROUP", "{group}", "DESCRIBE", why="the group's committed offsets (a share group's backlog)"),
    ),
    "migrate": (
        Acl("TOPIC", "{input}", "READ", why="re-read every document from the start"),
        Acl("TOPIC", "{input}", "DESCRIBE_CONFIGS", why="check that its retention keeps every live document"),
        Acl("GROUP", "{group}.migrate.", "READ", prefixed=True, why="the backfill's own group, "
                                                                   "<group>.migrate.<new collection>"),
        *_OUTPUTS,
    ),
}


def table() -> list[str]:
    """The Markdown table of :data:`ACLS`, as ``docs/operations.md`` shows it."""
    rows = ["| mode | resource | name | operation | for |", "|---|---|---|---|---|"]
    for mode, acls in ACLS.items():
        for a in acls:
            name = f"`{a.name}`" + (" (prefix)" if a.prefixed else "")
            rows.append(f"| {mode} | {a.resource.replace('_', ' ').title()} | {name} | "
                        f"{a.operation.replace('_', ' ').title()} | {a.why} |")
    return rows
