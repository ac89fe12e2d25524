"""The typed record that crosses the seam as a JSON object (`Record`, the base of results.py's records): from_json
checks every declared field's type and says in one line where a document is wrong (RecordError), to_json writes the
record back, and json_schema draws a record's JSON schema from the same fields (scripts/schemas.py writes
docs/schemas/ from it). Standard library only: it is shipped with the agent and the client imports it too.
"""

from __future__ import annotations

import types
import typing
from dataclasses import Field, field, fields
from typing import Any, ClassVar, Mapping

__all__ = ["Record", "RecordError", "absent_fields", "check_fields", "json_schema", "newer_fields", "typed"]

BOOKKEEPING = ("newer", "absent")


class RecordError(ValueError):
    """A JSON document that is not the record it should be: names the record, the field and what it held."""


def newer_fields() -> Any:
    """A record's `newer`: the keys of its JSON object that this reader does not declare. This harness writes only
    declared keys (tests hold every record to that); a newer harness may write more, and they are kept, untyped, so
    its summary reads back and writes back as it was (the one way forward compatibility is kept)."""
    return field(default_factory=dict, repr=False)


def absent_fields() -> Any:
    """A record's `absent`: the declared fields its JSON object lacked (none, for a record built in code)."""
    return field(default=frozenset(), repr=False, compare=False)


def typed(default: Any = None, *, factory: Any = None, **schema: Any) -> Any:
    """A declared field with what its JSON schema says beyond its type (enum, minimum, description, a $ref)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"schema": schema})
    return field(default=default, metadata={"schema": schema})


_HINTS: dict[type, dict[str, Any]] = {}


def _declared(cls: type) -> list[tuple[Field, Any]]:
    """The record's declared fields with their resolved types (bookkeeping left out)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    hints = _HINTS[cls]
    return [(f, hints[f.name]) for f in fields(cls) if f.name not in BOOKKEEPING]


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Record)


def _arms(hint: Any) -> tuple[Any, ...] | None:
    """A union's arms (X | None included), or None for any other type."""
    origin = typing.get_origin(hint)
    return typing.get_args(hint) if origin in (typing.Union, types.UnionType) else None


def describe(hint: Any) -> str:
    """A type in words, for an error: "a number or null", "a list of RowResult"."""
    arms = _arms(hint)
    if arms is not None:
        return " or ".join(describe(arm) for arm in arms)
    origin = typing.get_origin(hint)
    if origin is list:
        return f"a list of {describe(typing.get_args(hint)[0])}"
    if origin is dict:
        return f"an object of {describe(typing.get_args(hint)[1])}"
    if _is_record(hint):
        return f"an object ({hint.__name__})"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null",
            Any: "anything", dict: "an object", list: "a list"}.get(hint, str(hint))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check(value: Any, hint: Any, where: str) -> Any:
    """value as hint says it must be (a nested record read from its object); RecordError naming where otherwise."""
    arms = _arms(hint)
    if arms is not None:
        if value is None and type(None) in arms:
            return None
        others = [arm for arm in arms if arm is not type(None)]
        if len(others) == 1 and (_is_record(others[0]) or typing.get_origin(others[0]) is not None):
            return check(value, others[0], where)  # an object or a list: its own error says where inside
        for arm in others:
            try:
                return check(value, arm, where)
            except RecordError:
                pass
        raise RecordError(f"{where}: expected {describe(hint)}, got {_shown(value)}")
    if _is_record(hint):
        return hint.from_json(value, where)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected {describe(hint)}, got {_shown(value)}")
        return [check(item, args[0], f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise RecordError(f"{where}: expected {describe(hint)}, got {_shown(value)}")
        return {k: check(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if hint is Any or _fits(value, hint):
        return value
    raise RecordError(f"{where}: expected {describe(hint)}, got {_shown(value)}")


def check_fields(cls: type, value: Mapping[str, Any], where: str, **hints: Any) -> None:
    """RecordError unless each key of value that names one of dataclass cls's fields holds that field's type (hints:
    a field's JSON type where its Python one is not, a tuple read from a list); for a dataclass not made a Record."""
    declared = {**typing.get_type_hints(cls), **hints}
    for f in fields(cls):
        if f.name in value and f.name not in BOOKKEEPING:
            check(value[f.name], declared[f.name], f"{where}.{f.name}")


def _fits(value: Any, hint: Any) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # an integer is a number too
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    return isinstance(value, hint)


class Record:
    """A typed record that crosses the seam as a JSON object (the base of every record in results.py).

    from_json reads the declared fields, each checked against its type, and which declared fields the object lacked
    (`absent`); keys it does not declare are a newer harness's (`newer`, see newer_fields). to_json writes them back,
    so a results.json of an older or newer harness reads back as it was written. SCHEMA: what the record's JSON
    schema says beyond its fields (required, if/then rules, its description).
    """

    SCHEMA: ClassVar[dict[str, Any]] = {}

    @classmethod
    def from_json(cls, value: Any, where: str | None = None) -> Any:
        """The record in a JSON object; RecordError (a ValueError) naming the record, the field and what it held."""
        where = where or cls.__name__
        if not isinstance(value, Mapping):
            raise RecordError(f"{where}: expected a JSON object, got {_shown(value)}")
        declared = _declared(cls)
        known = {f.name: check(value[f.name], hint, f"{where}.{f.name}") for f, hint in declared if f.name in value}
        names = {f.name for f, _ in declared}
        return cls(**known, newer={k: v for k, v in value.items() if k not in names},  # type: ignore[call-arg]
                   absent=frozenset(name for name in names if name not in value))

    def __setattr__(self, name: str, value: Any) -> None:
        """A declared field set after the record was read is present from then on (written by to_json)."""
        absent = self.__dict__.get("absent")
        if absent and name in absent:
            object.__setattr__(self, "absent", absent - {name})
        object.__setattr__(self, name, value)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the declared fields the record has, in order, then what a newer harness wrote."""
        record: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            if f.name in BOOKKEEPING or f.name in self.absent:  # type: ignore[attr-defined]
                continue
            record[f.name] = _json_of(getattr(self, f.name))
        return {**record, **self.newer}  # type: ignore[attr-defined]


def _json_of(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_json_of(item) for item in value]
    return value


# --------------------------------------------------------------------------------------------- JSON schema


def json_schema(root: type[Record], parts: Mapping[str, Any]) -> dict[str, Any]:
    """root's JSON schema (draft 2020-12): root's fields at the top, every record it holds under $defs (closed:
    additionalProperties false), beside parts (the hand-written shapes of what the records hold as plain objects)."""
    defs: dict[str, Any] = {}
    top = _record_schema(root, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **top, "$defs": {**dict(parts), **defs}}


def field_notes(cls: type[Record]) -> dict[str, str]:
    """Each field's comment in the record's source, its description in the schema: the comment on its line, with
    the comment lines below it; comment lines above a field with none on its own line are that field's."""
    notes: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a record that extends another: the fields it declares in its own source
        if klass is not Record and issubclass(klass, Record) and "__dataclass_fields__" in vars(klass):
            notes.update(_source_notes(klass, {f.name for f, _ in _declared(cls)}))
    return notes


def _source_notes(cls: type, names: set[str]) -> dict[str, str]:
    import inspect

    notes: dict[str, str] = {}
    pending: list[str] = []
    last: str | None = None  # the field above, when its line has a comment that lines below may continue
    for line in inspect.getsource(cls).splitlines()[1:]:
        name, _, rest = line[4:].partition(":") if line.startswith("    ") and line[4:5].isalpha() else ("", "", "")
        if name in names:
            note = rest.partition("  # ")[2].strip()
            if note and last and pending:
                notes[last] += " " + " ".join(pending)
            elif pending and not note:
                note = " ".join(pending)
            if note:
                notes[name] = note
            pending, last = [], name if "  # " in rest else None
        elif line.strip().startswith("#"):
            pending.append(line.strip().lstrip("#").strip())
        else:
            if last and pending:
                notes[last] += " " + " ".join(pending)
            pending, last = [], None
    return notes


def _record_schema(cls: type[Record], defs: dict[str, Any]) -> dict[str, Any]:
    properties = {}
    notes = field_notes(cls)
    for f, hint in _declared(cls):
        extra = dict(f.metadata.get("schema", {}))
        drawn = _type_schema(hint, defs)
        if "ref" in extra:  # a plain object whose shape is hand-written (json_schema's parts)
            ref = {"$ref": f"#/$defs/{extra.pop('ref')}"}
            drawn = {"anyOf": [ref, {"type": "null"}]} if _arms(hint) else ref
        properties[f.name] = {**drawn, **extra, **({"description": notes[f.name]} if f.name in notes else {})}
    doc = " ".join((cls.__doc__ or "").split("\n\n")[0].split())
    return {"type": "object", "description": doc, **cls.SCHEMA, "properties": properties,
            "additionalProperties": False}


def _type_schema(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    arms = _arms(hint)
    if arms is not None:
        drawn = [_type_schema(arm, defs) for arm in arms]
        if all(set(d) == {"type"} and isinstance(d["type"], str) for d in drawn):
            return {"type": [d["type"] for d in drawn]}
        return {"anyOf": drawn}
    if _is_record(hint):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # a record that holds itself stops here
            defs[hint.__name__] = _record_schema(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0], defs)}
    if origin is dict:
        values = _type_schema(args[1], defs)
        return {"type": "object", **({"additionalProperties": values} if values else {})}
    if hint is Any:
        return {}
    names = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null", dict: "object",
             list: "array"}
    return {"type": names[hint]}


