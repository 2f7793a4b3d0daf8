"""What a producer's Avro writer schema can make a reader do, judged before any record is read.

An Avro array or map is a count, then that many items. An item that takes no bytes at all (``null``,
a ``fixed`` of size 0, a record whose fields all take none) lets a few bytes of a record claim 2^62
items: the reader then steps through them one by one, holding the polling thread for ever, while a
bound on the record's size bounds nothing. :func:`zero_byte_collection` finds such an array or map in
a writer schema, so that records written with it are refused (``incompatible_schema``) instead.

It walks the schema as the reader parsed it (fastavro's parse, where every named type is defined and
referred to by its full name), so names resolve exactly as the reader resolves them: two types of one
short name in two namespaces are two types. :func:`json_depth` bounds how deep a schema may nest
before anything recursive walks it.
"""

from __future__ import annotations

from typing import Any

#: Primitive types by name: each takes at least one byte, except ``null``.
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def json_depth(text: str, limit: int) -> int:
    """How deep the JSON ``text`` nests arrays and objects, read from its brackets outside strings (no
    parser runs: Python's is recursive); stops reading past ``limit`` (returns ``limit + 1``)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return limit + 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def zero_byte_collection(parsed: Any) -> str | None:
    """The path of the first array or map in ``parsed`` (a schema as fastavro's ``parse_schema``
    returns it) whose items take no bytes (``"record io.Doc field tags: array of null"``); None when
    there is none. Named types are followed by full name, recursion included."""
    names: dict[str, Any] = {}
    _collect(parsed, names)
    return _Walk(names).find(parsed, "")


def _collect(node: Any, names: dict[str, Any]) -> None:
    """Every named type (record, enum, fixed) defined under ``node``, by its full name."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            kind = item.get("type")
            if kind in ("record", "error", "enum", "fixed") and isinstance(item.get("name"), str):
                names.setdefault(item["name"], item)
            if kind in ("record", "error"):
                stack.extend(f.get("type") for f in item.get("fields") or () if isinstance(f, dict))
            elif kind == "array":
                stack.append(item.get("items"))
            elif kind == "map":
                stack.append(item.get("values"))
            elif isinstance(kind, (dict, list)):
                stack.append(kind)


class _Walk:
    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names
        self._sizing: set[int] = set()  # records being sized (a recursive one takes bytes to end)
        self._seen: set[int] = set()  # records already searched

    def _resolve(self, node: Any) -> Any:
        return self.names.get(node, node) if isinstance(node, str) and node not in _PRIMITIVES else node

    def empty(self, node: Any) -> bool:
        """Whether every value of ``node`` is encoded in zero bytes."""
        node = self._resolve(node)
        if isinstance(node, str):
            return node == "null"
        if isinstance(node, list):  # a union writes its branch index
            return False
        if not isinstance(node, dict):
            return False
        kind = node.get("type")
        if kind == "fixed":
            return node.get("size") == 0
        if kind in ("record", "error"):
            if id(node) in self._sizing:
                return False
            self._sizing.add(id(node))
            try:
                return all(self.empty(f.get("type")) for f in node.get("fields") or () if isinstance(f, dict))
            finally:
                self._sizing.discard(id(node))
        if isinstance(kind, (str, dict, list)) and kind not in ("array", "map", "enum"):
            return self.empty(kind)  # {"type": "null"}, {"type": "long", "logicalType": ...}
        return False

    def find(self, node: Any, path: str) -> str | None:
        node = self._resolve(node)
        if isinstance(node, list):
            for branch in node:
                found = self.find(branch, path)
                if found:
                    return found
            return None
        if not isinstance(node, dict):
            return None
        kind = node.get("type")
        if kind in ("array", "map"):
            items = node.get("items" if kind == "array" else "values")
            where = f"{path}{kind} of {_label(self._resolve(items))}"
            if self.empty(items):
                return where
            return self.find(items, f"{where}: ")
        if kind in ("record", "error"):
            if id(node) in self._seen:
                return None
            self._seen.add(id(node))
            for field in node.get("fields") or ():
                if isinstance(field, dict):
                    found = self.find(field.get("type"), f"{path}record {node.get('name')} field {field.get('name')}: ")
                    if found:
                        return found
            return None
        if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind in self.names):
            return self.find(kind, path)
        return None


def _label(node: Any) -> str:
    if isinstance(node, dict):
        return f"{node.get('type')} {node.get('name', '')}".strip()
    return str(node) if not isinstance(node, list) else "a union"


def recursive_type(parsed: Any) -> str | None:
    """The full name of a named type in ``parsed`` (as :func:`zero_byte_collection` takes it) that
    refers to itself, directly or through others; None when there is none. Found without recursion:
    each named type's references to others, then a depth-first search for a cycle among them."""
    names: dict[str, Any] = {}
    _collect(parsed, names)
    refers: dict[str, set[str]] = {}
    for name, node in names.items():
        found: set[str] = set()
        stack: list[Any] = [f.get("type") for f in node.get("fields") or () if isinstance(f, dict)] \
            if node.get("type") in ("record", "error") else []
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if item in names:
                    found.add(item)
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, dict):
                if item.get("type") in ("record", "error", "enum", "fixed") and isinstance(item.get("name"), str):
                    found.add(item["name"])  # defined inline: its own fields are its own entry's
                elif item.get("type") == "array":
                    stack.append(item.get("items"))
                elif item.get("type") == "map":
                    stack.append(item.get("values"))
                else:
                    stack.append(item.get("type"))
        refers[name] = found
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in refers:
        if state.get(start):
            continue
        path: list[tuple[str, list[str]]] = [(start, sorted(refers[start]))]
        state[start] = 1
        while path:
            name, todo = path[-1]
            if not todo:
                state[name] = 2
                path.pop()
                continue
            nxt = todo.pop()
            if state.get(nxt) == 1:
                return nxt
            if not state.get(nxt):
                state[nxt] = 1
                path.append((nxt, sorted(refers.get(nxt, ()))))
    return None
