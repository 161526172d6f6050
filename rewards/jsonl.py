"""The one JSON Lines reader: `rlvr score`'s completion files (rewards/cli.py) and rlvr_env's data files
(rlvr_env/data.py: tasks' datasets, DPO's preference pairs, reward models' data) read through it.

A file is read as bytes and decoded line by line, so a bad byte is named with its line and column. ``utf-8-sig``: a
byte-order mark (Windows editors write one) is no error. Blank lines are skipped. Every problem a line can have is a
JsonLinesError naming ``path:line``: bytes that are not UTF-8, text that is not JSON, an integer past int()'s
4300-digit limit, JSON nested past the recursion limit, a value that is not an object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class JsonLinesError(ValueError):
    """A line of a JSON Lines file that cannot be read: the message is ``f"{where}: {problem}"``; ``where``:
    ``path:line``; ``kind``: "encoding" (``detail``: the byte and its column), "json" (``detail``: the parser's
    message and column), "number", "nesting" or "object"."""

    def __init__(self, where: str, kind: str, problem: str, detail: str = "") -> None:
        super().__init__(f"{where}: {problem}")
        self.where, self.kind, self.problem, self.detail = where, kind, problem, detail


def read_json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(1-based line number, object)`` for each non-blank line of ``path``, read as it is iterated (a caller that
    checks each object meets the first bad line first, whatever is wrong with it). Opening the file happens here, so
    an OSError comes from this call; each bad line is a JsonLinesError."""
    handle = Path(path).open("rb")  # bytes, so a line that is not UTF-8 can be named
    return _records(Path(path), handle)


def _records(path: Path, handle: IO[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    with handle:
        for number, raw in enumerate(handle, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8-sig")  # a byte-order mark is no error
            except UnicodeDecodeError as error:  # error.object: the line's bytes after a BOM
                detail = f"byte 0x{error.object[error.start]:02x} at column {error.start + 1}"
                raise JsonLinesError(where, "encoding", f"not UTF-8 ({detail})", detail) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                detail = f"{error.msg} at column {error.colno}"
                raise JsonLinesError(where, "json", f"invalid JSON ({detail})", detail) from None
            except ValueError as error:  # an integer of more than 4300 digits, past int()'s limit
                raise JsonLinesError(where, "number", f"cannot read the JSON ({error})", str(error)) from None
            except RecursionError:
                raise JsonLinesError(where, "nesting", "JSON nested too deeply") from None
            if not isinstance(record, dict):
                raise JsonLinesError(where, "object", f"expected a JSON object, got {type(record).__name__}")
            yield number, record
