"""task.toml's [baseline] and [baseline.sha256] tables, read and edited line by line: every other byte of the file is
kept, and the result is re-parsed to prove that only the pinned keys changed."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from ..errors import BaselineError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli backport, if installed
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

HEADER = re.compile(r"\s*\[")
BASELINE_HEADER = re.compile(r"\s*\[\s*baseline\s*\]\s*(#.*)?")
KEY_LINE = re.compile(r"\s*([A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*=")


def read_task_toml(path: Path) -> str:
    if not path.is_file():
        raise BaselineError(f"{path}: missing — a task folder needs a task.toml (see docs/task-contract.md)")
    text = path.read_text(encoding="utf-8")
    parse_toml(text, path)
    return text


def parse_toml(text: str, path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise BaselineError("editing task.toml needs Python 3.11+ (tomllib) or the tomli package: pip install tomli")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BaselineError(f"{path}: not valid TOML: {exc}") from None


def edit_baseline_table(text: str, values: dict[str, Any], path: Path) -> str:
    """text with [baseline]'s keys set to values: existing key lines replaced in place (a trailing comment kept),
    missing keys added after the table's last key, the table appended if absent; every other line untouched."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    header = next((i for i, line in enumerate(lines) if BASELINE_HEADER.fullmatch(line.rstrip("\r\n"))), None)
    if header is None:
        ending = "" if not lines or lines[-1].endswith("\n") else newline
        table = "".join(f"{key} = {toml_value(values[key])}{newline}" for key in values)
        edited = f"{text}{ending}{newline}[baseline]{newline}{table}"
    else:
        edited = "".join(edit_table_lines(lines, header, values, newline, path))
    check_only_pin_changed(text, edited, values, path)
    return edited


def edit_table_lines(lines: list[str], header: int, values: dict[str, Any], newline: str, path: Path) -> list[str]:
    spans = key_spans(lines, header, path)
    pending = dict(values)
    out = lines[: header + 1]
    cursor = header + 1
    last_key_end = header + 1
    insert_at = len(out)
    for key, start, end in spans:
        out.extend(lines[cursor:start])
        if key in pending:
            out.append(replaced_line(lines[start:end], key, pending.pop(key), newline))
        else:
            out.extend(lines[start:end])
        cursor = last_key_end = end
        insert_at = len(out)
    added = [f"{key} = {toml_value(value)}{newline}" for key, value in pending.items()]
    if added and insert_at > 0 and not out[insert_at - 1].endswith("\n"):
        out[insert_at - 1] += newline  # the table's last key was the file's unterminated last line
    out[insert_at:insert_at] = added
    out.extend(lines[last_key_end:])
    return out


def key_spans(lines: list[str], header: int, path: Path) -> list[tuple[str, int, int]]:
    """(key, first line, end line) of each key of the table after header; a value may span lines (an array, a
    multi-line string): it ends at the first line where the key = value text parses as TOML."""
    spans = []
    i = header + 1
    while i < len(lines):
        line = lines[i]
        if HEADER.match(line):
            break
        match = KEY_LINE.match(line)
        if not match:
            i += 1
            continue
        end = i + 1
        while not parses("".join(lines[i:end])):
            end += 1
            if end > len(lines):
                raise BaselineError(f"{path}: cannot find where [baseline] {match.group(1)} ends")
        spans.append((match.group(1).strip("\"'"), i, end))
        i = end
    return spans


def parses(text: str) -> bool:
    try:
        tomllib.loads(text)
        return True
    except tomllib.TOMLDecodeError:
        return False


def replaced_line(old: list[str], key: str, value: Any, newline: str) -> str:
    """key = value, keeping the old line's indentation and, for a one-line value, its trailing comment."""
    first = old[0]
    indent = first[: len(first) - len(first.lstrip())]
    comment = trailing_comment(first.rstrip("\r\n")) if len(old) == 1 else ""
    ending = newline if old[-1].endswith("\n") else ""
    return f"{indent}{key} = {toml_value(value)}{comment}{ending}"


def trailing_comment(line: str) -> str:
    """The '   # ...' after a one-line key = value (a '#' inside a string is not one)."""
    for hash_at in (i for i, ch in enumerate(line) if ch == "#"):
        before = line[:hash_at]
        if parses(before):
            return line[len(before.rstrip()):]
    return ""


def toml_value(value: Any) -> str:
    # A JSON string or list of strings is also a valid TOML basic string / array (check_only_pin_changed proves it).
    return json.dumps(value, ensure_ascii=False)


def check_only_pin_changed(old_text: str, new_text: str, values: dict[str, Any], path: Path) -> None:
    expected = copy.deepcopy(parse_toml(old_text, path))
    expected.setdefault("baseline", {}).update(values)
    try:
        actual = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as exc:
        actual = {"error": str(exc)}
    if actual != expected:
        raise BaselineError(f"{path}: could not edit [baseline] safely; set it by hand to: "
                            + ", ".join(f"{k} = {toml_value(v)}" for k, v in values.items()))


SHA256_HEADER = re.compile(r"\s*\[\s*baseline\s*\.\s*sha256\s*\]\s*(#.*)?")


def edit_sha256_table(text: str, digests: dict[str, str], path: Path) -> str:
    """text with the [baseline.sha256] table's body replaced by digests (its header line and comment kept), or the
    table added right after [baseline]; re-parsed to prove nothing else changed."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    body = [f"{toml_value(rel)} = {toml_value(digest)}{newline}" for rel, digest in digests.items()]
    header = next((i for i, line in enumerate(lines) if SHA256_HEADER.fullmatch(line.rstrip("\r\n"))), None)
    if header is not None:
        end = next((i for i in range(header + 1, len(lines)) if HEADER.match(lines[i])), len(lines))
        while end > header + 1 and not lines[end - 1].strip():
            end -= 1  # keep the blank lines before the next table
        edited = lines[: header + 1] + body + lines[end:]
    else:
        start = next(i for i, line in enumerate(lines) if BASELINE_HEADER.fullmatch(line.rstrip("\r\n")))
        end = next((i for i in range(start + 1, len(lines)) if HEADER.match(lines[i])), len(lines))
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += newline
        table = [f"[baseline.sha256]        # each file as the wheel holds it; it lies at baseline/upstream/<path>"
                 f"{newline}", *body, newline]
        if end == len(lines):
            table = [newline, *table[:-1]]
        edited = lines[:end] + table + lines[end:]
    result = "".join(edited)
    expected = copy.deepcopy(parse_toml(text, path))
    expected.setdefault("baseline", {})["sha256"] = dict(digests)
    if parses(result) and tomllib.loads(result) == expected:
        return result
    raise BaselineError(f"{path}: could not edit [baseline.sha256] safely; set it by hand to: "
                        + ", ".join(f"{toml_value(k)} = {toml_value(v)}" for k, v in digests.items()))

