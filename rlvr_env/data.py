"""Loading local dataset files (JSON Lines, or parquet through `pyarrow`; one file, or a glob of a split's shards).

Nothing downloads: a dataset task reads a file whose path comes from a kwarg or
an environment variable, and every error names the path, the line and the field.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path
from typing import Any

from rewards.jsonl import JsonLinesError, read_json_lines
from rlvr_env.task import Problem, build_config


class DataFileError(ValueError):
    """A dataset file is missing or malformed; the message names path, line and field."""


def resolve_paths(path: str | os.PathLike | None, env_var: str, task_name: str) -> list[Path]:
    """The data files ``path`` names, else the environment variable ``env_var``: one file, or the files a glob pattern
    matches, in sorted order (a downloaded dataset's shards, ``data/train-*.parquet``)."""
    chosen = path if path is not None else os.environ.get(env_var)
    if not chosen:
        raise DataFileError(f"{task_name} needs a local data file: pass data_path=... or set {env_var}")
    source = "data_path" if path is not None else env_var
    expanded = os.path.expanduser(os.fspath(chosen))
    if any(character in expanded for character in "*?["):
        matches = sorted(Path(match) for match in glob.glob(expanded) if Path(match).is_file())
        if not matches:
            raise DataFileError(f"{task_name} data files {expanded!r} (from {source}): the pattern matches no file")
        return matches
    resolved = Path(expanded)
    if resolved.is_dir():
        raise DataFileError(f"{task_name} data file {str(resolved)!r} (from {source}) is a directory: name its files, "
                            f"e.g. {str(resolved / 'train-*.parquet')!r} (a split's shards)")
    if not resolved.is_file():
        raise DataFileError(f"{task_name} data file {str(resolved)!r} (from {source}) does not exist or is not a file")
    return [resolved]


def read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` pairs: 1-based lines for JSON Lines (rewards.jsonl.read_json_lines: utf-8-sig, each
    bad line named), 1-based rows for parquet."""
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path)
    try:
        records = list(read_json_lines(path))
    except JsonLinesError as error:
        raise DataFileError(str(error)) from None
    if not records:
        raise DataFileError(f"{path}: no records")
    return records


def _read_parquet(path: Path) -> list[tuple[int, dict[str, Any]]]:
    # pyarrow directly, not datasets.Dataset.from_parquet: that caches by path and mtime (a file
    # rewritten within the same mtime tick gave the old rows) and writes Arrow files to the HF cache.
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise DataFileError(f"{path}: reading parquet needs `pyarrow` (pip install 'rlvr-env[data]')") from None
    try:
        with pyarrow.parquet.ParquetFile(path) as parquet_file:
            rows = parquet_file.read().to_pylist()
    except (pyarrow.ArrowException, OSError) as error:
        raise DataFileError(f"{path}: not a readable parquet file ({error})") from None
    if not rows:
        raise DataFileError(f"{path}: no records")
    return list(enumerate(rows, start=1))


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
    implement ``parse(records, path, config) -> list[Problem]``; the config needs ``data_path``.
    Problems are ``parsed[index]``; the seed does not change a fixed dataset."""

    env_var: str

    def __init__(self, config=None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._problems = self._load(self.config)

    def configure(self, **changes: Any) -> bool:
        config = build_config(self.config_cls, self.config, changes)
        if config == self.config:
            return False
        # Load first and assign after: a failed reload (e.g. filters that match nothing) leaves the task as it was.
        self._problems = self._load(config)
        self.config = config
        return True

    def _load(self, config) -> list[Problem]:
        """The problems of every file ``data_path`` names, in order; each one's ``index`` is its place among them (and
        its ``file`` is said when there are several)."""
        paths = resolve_paths(config.data_path, self.env_var, type(self).__name__)
        problems: list[Problem] = []
        for path in paths:
            source = {"file": str(path)} if len(paths) > 1 else {}
            problems += [dataclasses.replace(problem, metadata={"index": len(problems) + offset, **source, **problem.metadata})
                         for offset, problem in enumerate(self.parse(read_records(path), path, config))]
        if not problems:
            where = paths[0] if len(paths) == 1 else f"{len(paths)} files ({paths[0]}, ...)"
            raise DataFileError(f"{where}: no problems left after the filters in {config}")
        return problems

    @property
    def size(self) -> int:
        return len(self._problems)

    def __len__(self) -> int:
        return len(self._problems)

    def problem(self, index: int, seed: int):
        if not 0 <= index < len(self._problems):
            raise IndexError(f"problem index {index} out of range for {len(self._problems)} problems")
        return self._problems[index]
