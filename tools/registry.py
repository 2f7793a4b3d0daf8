"""A development stand-in for a Confluent-compatible schema registry (``embedstream dev up`` starts it).

No registry server installs from the package registries this project's machines reach (Karapace,
Redpanda's and Apicurio's ship as containers or source only), so the local stack runs this: the part
of the Confluent REST API that confluent-kafka's ``SchemaRegistryClient`` and its Avro serializers
call, and nothing more. It is never part of the chart; point ``EMBEDSTREAM_SCHEMA_REGISTRY_URL`` at a
real registry in production.

What it serves (Avro only):

* ``POST /subjects/{s}/versions`` — register (the same schema text gets the same global id under any
  subject; a new version is checked against the subject's latest under its compatibility level);
* ``POST /subjects/{s}`` — look a schema up under a subject;
* ``GET /schemas/ids/{id}``, ``GET /subjects``, ``GET /subjects/{s}/versions``,
  ``GET /subjects/{s}/versions/{n|latest}``;
* ``GET``/``PUT /config`` and ``/config/{s}`` (``BACKWARD`` by default, ``NONE`` turns checks off),
  ``POST /compatibility/subjects/{s}/versions/latest``.

Anything else answers 404, which is what confluent-kafka's default subject strategy needs to fall back
from its associations look-up. BACKWARD compatibility means "a reader with the new schema reads
data written with the old one"; it is checked with fastavro's own schema resolution on generated
records of the old schema (plus the same check fastavro does when it reads real data). Schemas are
kept in a JSON file, so ids survive a restart.

``lax`` (``--lax``) stores whatever is registered, any schema type, any text, unchecked, as a registry
that checks nothing would: the hostile-input tests plant the writer schemas an attacker could.

Run: ``python -m tools.registry --port 8081 --data registry.json``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import fastavro
from fastavro.utils import generate_many

LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE")
#: Records generated from the old schema per compatibility check (unions pick random branches).
CHECK_SAMPLES = 40


class RegistryError(Exception):
    """An error answer: HTTP status and Confluent error code."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _parse(text: str) -> Any:
    try:
        return fastavro.parse_schema(json.loads(text), _write_hint=False)
    except Exception as exc:  # fastavro raises several types on a bad schema
        raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None


def can_read(reader: str, writer: str) -> bool:
    """Whether data written with ``writer`` reads with ``reader`` (fastavro's resolution rules)."""
    w, r = _parse(writer), _parse(reader)
    try:
        for rec in generate_many(w, CHECK_SAMPLES):
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, w, rec)
            buf.seek(0)
            fastavro.schemaless_reader(buf, w, r)
    except Exception:
        return False
    return True


def compatible(level: str, new: str, olds: list[str]) -> bool:
    """Whether ``new`` may follow ``olds`` (oldest first) under ``level``."""
    if level == "NONE" or not olds:
        return True
    against = olds if level.endswith("_TRANSITIVE") else olds[-1:]
    backward = level.startswith(("BACKWARD", "FULL"))
    forward = level.startswith(("FORWARD", "FULL"))
    return all((not backward or can_read(new, old)) and (not forward or can_read(old, new)) for old in against)


class Store:
    """Subjects, versions and global ids, persisted to ``path`` (JSON) after every change."""

    def __init__(self, path: Path | None, lax: bool = False) -> None:
        self.path = path
        self.lax = lax
        #: ``schemaType`` and ``references`` of the schemas registered with them (lax only).
        self.extras: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()
        data = json.loads(path.read_text()) if path and path.exists() else {}
        self.schemas: dict[int, str] = {int(k): v for k, v in data.get("schemas", {}).items()}
        self.subjects: dict[str, list[int]] = data.get("subjects", {})
        self.config: dict[str, str] = data.get("config", {})
        self.default_level: str = data.get("default_level", "BACKWARD")

    def _save(self) -> None:
        if not self.path:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"schemas": self.schemas, "subjects": self.subjects, "config": self.config,
                                   "default_level": self.default_level}))
        tmp.replace(self.path)

    def _id_of(self, text: str) -> int | None:
        if self.lax:
            return next((sid for sid, known in self.schemas.items() if known == text), None)
        canon = json.dumps(json.loads(text), sort_keys=True)
        for sid, known in self.schemas.items():
            if json.dumps(json.loads(known), sort_keys=True) == canon:
                return sid
        return None

    def level(self, subject: str | None) -> str:
        return self.config.get(subject, self.default_level) if subject else self.default_level

    def set_level(self, subject: str | None, level: str) -> str:
        level = level.upper()
        if level not in LEVELS:
            raise RegistryError(422, 42203, f"Invalid compatibility level {level!r}")
        with self.lock:
            if subject:
                self.config[subject] = level
            else:
                self.default_level = level
            self._save()
        return level

    def register(self, subject: str, text: str, extras: dict[str, Any] | None = None) -> int:
        if self.lax:
            with self.lock:
                sid = max(self.schemas, default=0) + 1
                self.schemas[sid] = text
                self.extras[sid] = extras or {}
                self.subjects[subject] = [*self.subjects.get(subject, []), sid]
                return sid
        _parse(text)
        with self.lock:
            versions = self.subjects.get(subject, [])
            sid = self._id_of(text)
            if sid is not None and sid in versions:
                return sid
            if not compatible(self.level(subject), text, [self.schemas[v] for v in versions]):
                raise RegistryError(409, 409, "Schema being registered is incompatible with an earlier schema "
                                              f"for subject {subject!r} ({self.level(subject)})")
            if sid is None:
                sid = max(self.schemas, default=0) + 1
                self.schemas[sid] = text
            self.subjects[subject] = [*versions, sid]
            self._save()
            return sid

    def version(self, subject: str, which: str) -> dict[str, Any]:
        versions = self.subjects.get(subject)
        if not versions:
            raise RegistryError(404, 40401, f"Subject {subject!r} not found.")
        n = len(versions) if which in ("latest", "-1") else int(which)
        if not 1 <= n <= len(versions):
            raise RegistryError(404, 40402, f"Version {which} not found.")
        sid = versions[n - 1]
        return {"subject": subject, "version": n, "id": sid, "schema": self.schemas[sid], **self.extras.get(sid, {})}

    def lookup(self, subject: str, text: str) -> dict[str, Any]:
        if subject not in self.subjects:
            raise RegistryError(404, 40401, f"Subject {subject!r} not found.")
        sid = self._id_of(text)
        if sid is None or sid not in self.subjects[subject]:
            raise RegistryError(404, 40403, "Schema not found")
        return self.version(subject, str(self.subjects[subject].index(sid) + 1))

    def by_id(self, sid: int) -> dict[str, Any]:
        if sid not in self.schemas:
            raise RegistryError(404, 40403, f"Schema {sid} not found")
        return {"schema": self.schemas[sid], **self.extras.get(sid, {})}


def _route(store: Store, method: str, path: str, body: dict[str, Any]) -> Any:
    """The answer to one request, or :class:`RegistryError`."""
    parts = [unquote(p) for p in path.strip("/").split("/") if p]
    if body.get("schemaType", "AVRO") != "AVRO" and not store.lax:
        raise RegistryError(422, 42201, "this development registry serves Avro schemas only")
    match method, parts:
        case "GET", ["subjects"]:
            return sorted(store.subjects)
        case "GET", ["subjects", s, "versions"]:
            return list(range(1, store.version(s, "latest")["version"] + 1))
        case "GET", ["subjects", s, "versions", v]:
            return store.version(s, v)
        case "POST", ["subjects", s, "versions"]:
            extras = {k: body[k] for k in ("schemaType", "references", "ruleSet") if k in body}
            return {"id": store.register(s, _schema_text(body), extras)}
        case "POST", ["subjects", s]:
            return store.lookup(s, _schema_text(body))
        case "GET", ["schemas", "ids", sid] if sid.isdigit():
            return store.by_id(int(sid))
        case "GET", ["config"]:
            return {"compatibilityLevel": store.level(None)}
        case "GET", ["config", s]:
            return {"compatibilityLevel": store.level(s)}
        case "PUT", ["config", *rest] if len(rest) <= 1:
            return {"compatibility": store.set_level(rest[0] if rest else None, str(body.get("compatibility", "")))}
        case "POST", ["compatibility", "subjects", s, "versions", v]:
            old = store.version(s, v)["schema"]
            return {"is_compatible": compatible(store.level(s), _schema_text(body), [old])}
    raise RegistryError(404, 404, f"{method} /{'/'.join(parts)} is not served by this development registry")


def _schema_text(body: dict[str, Any]) -> str:
    text = body.get("schema")
    if not isinstance(text, str):
        raise RegistryError(422, 42201, "request has no 'schema' string")
    return text


class RegistryServer(ThreadingHTTPServer):
    """The HTTP server, with ``requests``: how many of each kind it answered (``GET /schemas/ids/{n}``),
    for tests that bound what a worker asks."""

    requests: Counter[str]


def make_server(port: int, data: Path | None, host: str = "127.0.0.1",
                basic_auth: str | None = None, lax: bool = False) -> RegistryServer:
    """The registry on ``port`` (0: any free port; ``server.server_port`` says which). ``basic_auth``
    (``user:password``): every request must carry those credentials, else 401, as a registry with
    HTTP basic authentication answers."""
    store = Store(data, lax)
    wanted = "Basic " + base64.b64encode(basic_auth.encode()).decode() if basic_auth else None
    requests: Counter[str] = Counter()

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive: the client closes first, so no TIME_WAIT is left on the registry's own port
        # after it stops (a port that `dev down` must leave free at once).
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: with Nagle's algorithm on, the body waited for the
        # client's delayed ACK, ~40 ms a request.
        disable_nagle_algorithm = True

        def _answer(self, method: str) -> None:
            path = urlsplit(self.path).path
            requests[f"{method} {re.sub(r'/[0-9]+', '/{n}', path)}"] += 1
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                if wanted and self.headers.get("Authorization") != wanted:
                    raise RegistryError(401, 40101, "Unauthorized")
                status, out = 200, _route(store, method, path, body)
            except RegistryError as exc:
                status, out = exc.status, {"error_code": exc.code, "message": exc.message}
            except (ValueError, json.JSONDecodeError) as exc:
                status, out = 422, {"error_code": 422, "message": f"bad request: {exc}"}
            raw = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._answer("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._answer("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._answer("PUT")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    server = RegistryServer((host, port), Handler)
    server.requests = requests
    return server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="embedstream's development schema registry (Confluent REST subset)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--data", type=Path, default=None, help="JSON file that keeps the schemas across restarts")
    ap.add_argument("--lax", action="store_true", help="store any schema registered, unchecked (tests)")
    ap.add_argument("--basic-auth", default=None, metavar="USER:PASSWORD",
                    help="answer 401 to any request without these HTTP basic credentials")
    args = ap.parse_args(argv)
    server = make_server(args.port, args.data, args.host, args.basic_auth, args.lax)
    print(f"development schema registry on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
