"""Checkpoints with everything needed for an exact resume, written atomically.

A checkpoint is a directory `checkpoint-<step>` holding the model (`model/`, a
transformers directory usable with `--model`) and `trainer.pt` (optimizer,
scheduler, python/numpy/torch RNG states, and the loop's own state such as the
data position). It is written under a temporary name and renamed into place,
so a run killed mid-write never leaves a checkpoint that looks complete.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
LEFTOVER_RE = re.compile(r"^\.checkpoint-\d+\.(?:tmp|stale)-(\d+)$")  # group 1: the writing process's pid
TRAINER_FILE = "trainer.pt"
CONFIG_FILE = "config.yaml"


def rng_state(device: torch.device) -> dict[str, Any]:
    """Python, numpy and torch CPU RNG states, and the training device's CUDA RNG state (only that GPU's:
    a resume may see other GPUs, or fewer, under another CUDA_VISIBLE_DEVICES)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with file.open("rb") as fh:
                os.fsync(fh.fileno())


def _numbered_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of each complete checkpoint of a run, oldest first."""
    if not output_dir.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in output_dir.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir())


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    return [path for _, path in _numbered_checkpoints(Path(output_dir))]


def checkpoint_step(path: str | Path) -> int:
    """The step a checkpoint-<step> directory was saved at."""
    match = CHECKPOINT_RE.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint-<step> directory")
    return int(match.group(1))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    tokenizer: Any = None,
    state: dict[str, Any] | None = None,
    keep_last: int = 2,
    config: Any = None,
) -> Path:
    """Write checkpoint-<step> atomically, then delete all but the `keep_last` newest. ``config`` (a run config
    dataclass) is kept as checkpoint-<step>/config.yaml: what the checkpoint was trained with, which a resume
    checks against (the run's own config.yaml is for people, who may edit it)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    if config is not None:
        from algos.config import save_config

        save_config(config, tmp / CONFIG_FILE)
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": rng_state(next(model.parameters()).device),
            "state": state or {},
        },
        tmp / TRAINER_FILE,
    )
    _fsync_tree(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): move the old one out of the way first
        stale = output_dir / f".checkpoint-{step}.stale-{os.getpid()}"
        final.rename(stale)
        shutil.rmtree(stale)
    tmp.rename(final)
    _fsync_dir(output_dir)  # the rename reaches the disk before any older checkpoint is deleted
    # Only checkpoints up to this step are pruned: this one is never deleted in favour of higher-numbered ones.
    for old in [path for number, path in _numbered_checkpoints(output_dir) if number <= step][:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    _remove_leftovers(output_dir)
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _remove_leftovers(output_dir: Path) -> None:
    """Delete half-written or half-deleted checkpoint folders of killed processes (a full model copy each)."""
    for path in output_dir.iterdir():
        if (m := LEFTOVER_RE.match(path.name)) and path.is_dir() and not _process_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
) -> dict[str, Any]:
    """Restore model weights, optimizer, scheduler and RNG states in place; return {'step', 'state'}."""
    from safetensors.torch import load_file

    path = Path(path)
    device = next(model.parameters()).device
    weights = {}
    for file in sorted((path / "model").glob("*.safetensors")):
        weights.update(load_file(file, device=str(device)))
    if not weights:
        raise FileNotFoundError(f"checkpoint {path} has no model weights (model/*.safetensors)")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    loaded = {model.state_dict()[k].data_ptr() for k in weights if k in model.state_dict()}
    # save_pretrained drops tied copies (lm_head = embeddings); those share storage with a loaded tensor.
    truly_missing = [k for k in missing if model.state_dict()[k].data_ptr() not in loaded]
    if truly_missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {truly_missing}, unexpected {unexpected}")
    # Our own file (holds numpy RNG state). Read onto the CPU, where RNG states must be, so a run saved on a
    # GPU resumes on a CPU-only host or another GPU; the optimizer moves its state to its parameters' device.
    trainer = torch.load(path / TRAINER_FILE, weights_only=False, map_location="cpu")
    optimizer.load_state_dict(trainer["optimizer"])
    if scheduler is not None and trainer["scheduler"] is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    set_rng_state(trainer["rng"], device)
    return {"step": trainer["step"], "state": trainer["state"]}
