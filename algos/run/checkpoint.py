"""Checkpoints with everything needed for an exact resume, written atomically.

A checkpoint is a directory `checkpoint-<step>` holding:
- `state/`: the trained weights and the optimizer's state, as torch.distributed.checkpoint (DCP) writes
  them: each rank its shards, loadable by any number of ranks (2 ranks -> 1 and back);
- `model/`: the policy as a transformers directory usable with `--model` (written by rank 0);
- `trainer.pt`: scheduler, step and the loop's own state; `rng-<rank>.pt`: each rank's python/numpy/torch RNGs;
- `config.yaml`: the config it was trained with.
It is written under a temporary name and renamed into place, so a run killed mid-write (any rank)
never leaves a checkpoint that looks complete. One process is the same code with one rank.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict

from algos.config import save_config
from algos.model.lora import has_lora, save_adapter
from algos.system.distributed import barrier, broadcast_from_main, current_world, learner_group
from algos.system.paths import numbered_checkpoints

LEFTOVER_RE = re.compile(r"^\.checkpoint-\d+\.(?:tmp|stale)-(\d+)$")  # group 1: the writing process's pid
TRAINER_FILE = "trainer.pt"
CONFIG_FILE = "config.yaml"
STATE_DIR = "state"  # DCP: weights and optimizer state


def _rng_file(rank: int) -> str:
    return f"rng-{rank}.pt"


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


@contextlib.contextmanager
def _one_process_is_intended() -> Iterator[None]:
    """DCP warns that it assumes one process whenever no process group exists: here that is the plain run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
        yield


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with file.open("rb") as fh:
                os.fsync(fh.fileno())


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
    export: torch.nn.Module | None = None,
) -> Path:
    """Write checkpoint-<step> atomically, then delete all but the `keep_last` newest. Every rank calls it.

    ``model``: the module whose weights are saved with ``optimizer`` (a trainer's TrainingForward, DDP- or
    FSDP2-wrapped or plain); ``export``: the transformers model inside it written to model/ (default: ``model``).
    ``config`` (a run config dataclass) is kept as checkpoint-<step>/config.yaml: what the checkpoint was trained
    with, which a resume checks against (the run's own config.yaml is for people, who may edit it)."""
    world = current_world()
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / broadcast_from_main(f".checkpoint-{step}.tmp-{os.getpid()}")  # rank 0 names it
    if world.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    weights, optimizer_state = get_state_dict(model, optimizer)
    with _one_process_is_intended():
        dcp.save({"model": weights, "optimizer": optimizer_state}, checkpoint_id=tmp / STATE_DIR,
                 process_group=learner_group())
    torch.save(rng_state(next(model.parameters()).device), tmp / _rng_file(world.rank))
    export_model(model, export if export is not None else model, tmp / "model", tokenizer)
    if world.is_main:
        if config is not None:

            save_config(config, tmp / CONFIG_FILE)
        torch.save({"step": step, "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "state": state or {}}, tmp / TRAINER_FILE)
    barrier()  # every rank's files are written
    if world.is_main:
        # re-saving a step (e.g. after a resume) moves the old one aside; the rename reaches the disk before any
        # older checkpoint is deleted
        replace_directory(tmp, final, stale=output_dir / f".checkpoint-{step}.stale-{os.getpid()}")
        # Only checkpoints up to this step are pruned: this one is never deleted in favour of higher-numbered ones.
        for old in [path for number, path in numbered_checkpoints(output_dir) if number <= step][:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        _remove_leftovers(output_dir)
    barrier()  # no rank goes on (or reads latest_checkpoint) before the checkpoint is in place
    return final


def replace_directory(written: Path, final: Path, *, stale: Path) -> None:
    """Put the completely written directory ``written`` in ``final``'s place, synced to disk: a ``final`` already
    there is moved to ``stale`` first and deleted only once the new one is in place, so a kill at any point leaves
    a whole directory under ``final``'s name or under ``stale``'s, never half of one."""
    _fsync_tree(written)
    if final.exists():
        final.rename(stale)
    written.rename(final)
    _fsync_dir(final.parent)
    shutil.rmtree(stale, ignore_errors=True)


def export_model(model: torch.nn.Module, export: torch.nn.Module, directory: Path, tokenizer: Any = None) -> None:
    """Write ``export``, the transformers model inside ``model`` (a trainer's TrainingForward, wrapped or not), to
    ``directory`` as a transformers directory (with ``tokenizer``), or, for a LoRA policy, its adapter in PEFT's
    format (``rlvr export --merge`` merges it); from rank 0. Every rank calls it."""
    # Collective under FSDP2 (every rank sends its shards); the whole tensors arrive on rank 0's CPU.
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not current_world().is_main:
        return
    prefix = next(name for name, module in model.named_modules() if module is export)
    exported = {key.removeprefix(f"{prefix}."): value for key, value in whole.items() if key.startswith(prefix)}
    # A tied weight (lm_head = embeddings) is one parameter under two names: transformers saves it once.
    first_name: dict[int, str] = {}
    for name, parameter in export.named_parameters(remove_duplicate=False):
        if first_name.setdefault(id(parameter), name) != name:
            exported.pop(name, None)
    if has_lora(export):  # the adapter alone, in PEFT's format: PeftModel.from_pretrained(base, directory)
        save_adapter(export, directory, exported)
    else:
        export.save_pretrained(directory, state_dict=exported, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


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
    """Restore weights, optimizer, scheduler and RNG states in place (every rank calls it, with as many ranks as
    saved or not); return {'step', 'state'}. ``model`` as save_checkpoint's."""
    path = Path(path)
    if not (path / STATE_DIR).is_dir():
        raise FileNotFoundError(f"checkpoint {path} has no {STATE_DIR}/ (the weights and optimizer state): a checkpoint "
                                f"written before checkpoints were sharded cannot be resumed; start a run from its "
                                f"model/ with --model {path / 'model'}")
    weights, optimizer_state = get_state_dict(model, optimizer)
    stored = dcp.FileSystemReader(path / STATE_DIR).read_metadata().state_dict_metadata
    stored_weights = {key.removeprefix("model.") for key in stored if key.startswith("model.")}
    missing, unexpected = sorted(set(weights) - stored_weights), sorted(stored_weights - set(weights))
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}")
    saved = {"model": weights, "optimizer": optimizer_state}
    with _one_process_is_intended():
        dcp.load(saved, checkpoint_id=path / STATE_DIR, process_group=learner_group())
    set_state_dict(model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"])
    # Our own files (numpy RNG state). Read onto the CPU, where RNG states must be, so a run saved on a
    # GPU resumes on a CPU-only host or another GPU; the optimizer moves its state to its parameters' device.
    trainer = torch.load(path / TRAINER_FILE, weights_only=False, map_location="cpu")
    if scheduler is not None and trainer["scheduler"] is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    rank = current_world().rank
    # A resume on more ranks than saved: the new ranks take rank 0's streams (sampling draws from per-row seeds).
    rng = path / _rng_file(rank) if (path / _rng_file(rank)).is_file() else path / _rng_file(0)
    set_rng_state(torch.load(rng, weights_only=False, map_location="cpu"), next(model.parameters()).device)
    return {"step": trainer["step"], "state": trainer["state"]}
