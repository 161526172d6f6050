"""Where a run keeps its checkpoints: ``<output_dir>/checkpoint-<step>/``, numbered by the step saved. Below the
model loaders, which resolve a run directory to its latest checkpoint's model."""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def numbered_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of each complete checkpoint of a run, oldest first."""
    if not output_dir.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in output_dir.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir())


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    return [path for _, path in numbered_checkpoints(Path(output_dir))]


def checkpoint_step(path: str | Path) -> int:
    """The step a checkpoint-<step> directory was saved at."""
    match = CHECKPOINT_RE.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint-<step> directory")
    return int(match.group(1))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None
