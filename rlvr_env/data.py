"""Loading local dataset files (JSON Lines, or parquet through `datasets`).

Nothing downloads: a dataset task reads a file whose path comes from a kwarg or
an environment variable, and every error names the path, the line and the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class DataFileError(ValueError):
    """A dataset file is missing or malformed; the message names path, line and field."""


def resolve_path(path: str | os.PathLike | None, env_var: str, task_name: str) -> Path:
    """``path`` if given, else the environment variable ``env_var``; it must exist."""
    chosen = path if path is not None else os.environ.get(env_var)
    if not chosen:
        raise DataFileError(f"{task_name} needs a local data file: pass data_path=... or set {env_var}")
    resolved = Path(chosen).expanduser()
    if not resolved.is_file():
        source = "data_path" if path is not None else env_var
        raise DataFileError(f"{task_name} data file {str(resolved)!r} (from {source}) does not exist or is not a file")
    return resolved


def read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` pairs: 1-based lines for JSON Lines, 1-based rows for parquet."""
    if path.suffix == ".parquet":
        return _read_parquet(path)
    records = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFileError(f"{path}:{line_number}: invalid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise DataFileError(f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}")
            records.append((line_number, record))
    if not records:
        raise DataFileError(f"{path}: no records")
    return records


def _read_parquet(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise DataFileError(f"{path}: reading parquet needs `datasets` (pip install 'rlvr-env[data]')") from None
    table = datasets.Dataset.from_parquet(str(path), keep_in_memory=True)
    if len(table) == 0:
        raise DataFileError(f"{path}: no records")
    return [(row_number, dict(row)) for row_number, row in enumerate(table, start=1)]


def require_str(record: dict[str, Any], field: str, path: Path, line: int) -> str:
    """``record[field]`` as a non-empty string, or a DataFileError naming where it is missing."""
    if field not in record:
        raise DataFileError(f"{path}:{line}: missing field {field!r} (fields: {', '.join(sorted(record))})")
    value = record[field]
    if not isinstance(value, str) or not value.strip():
        raise DataFileError(f"{path}:{line}: field {field!r} must be a non-empty string, got {value!r}")
    return value


class DatasetTask:
    """Mixin for tasks backed by a local file: subclasses set ``env_var`` and
    implement ``parse(records, path) -> list[Problem]``; the config needs ``data_path``.
    Problems are ``parsed[index]``; the seed does not change a fixed dataset."""

    env_var: str

    def __init__(self, config=None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._load()

    def configure(self, **changes: Any) -> bool:
        changed = super().configure(**changes)
        if changed:  # e.g. new level filters or another file
            self._load()
        return changed

    def _load(self) -> None:
        path = resolve_path(self.config.data_path, self.env_var, type(self).__name__)
        self._problems = self.parse(read_records(path), path)
        if not self._problems:
            raise DataFileError(f"{path}: no problems left after the filters in {self.config}")

    @property
    def size(self) -> int:
        return len(self._problems)

    def __len__(self) -> int:
        return len(self._problems)

    def problem(self, index: int, seed: int):
        if not 0 <= index < len(self._problems):
            raise IndexError(f"problem index {index} out of range for {len(self._problems)} problems")
        return self._problems[index]
