"""A run's output directory: a fresh start, an overwrite, or a resume from its latest checkpoint.

A checkpoint stores the config it was trained with (checkpoint-N/config.yaml). A resume continues
that config: the config given for it may differ only in RESUME_OVERRIDES (how long the run goes,
how it reports, where and in what precision it computes); any other difference, or a key the stored config lacks
(written before the key existed, so what the run did there is unknown), is refused by name. A whole section the
stored config lacks that was off before it existed (SECTIONS_OFF_BY_DEFAULT: warm_start) reads as off: its switch
at its default, its other keys as given (an off section's settings did nothing); so does a rollout engine's section
it lacks (ENGINE_SECTIONS: an engine registered after the run was saved, which did not sample it), and so does a key
whose default is what runs did before it existed (KEYS_AT_THEIR_DEFAULT_BEFORE).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

from algos.config import ENGINE_SECTIONS, from_dict, load_file, save_config, to_dict, with_renamed_keys
from algos.model.loading import resolve_model_path
from algos.run import checkpoint as ckpt
from algos.system.paths import checkpoint_step, latest_checkpoint, list_checkpoints

# the policy after the warm start (algos/run/warm_start.py): a transformers directory, the KL reference
WARM_START_DIR = "warm_start"
# the best model the run held (run.metric_for_best_model: algos/run/best_model.py)
BEST_MODEL_DIR = "best_model"

# Sections a config saved before they existed lacks, each with the key whose default turns it off (what such a run
# did: no warm start): its resume reads them off instead of refusing their keys as unknown.
SECTIONS_OFF_BY_DEFAULT = {"warm_start": "warm_start.steps"}

# Keys a config saved before they existed lacks, whose default is what every run did then (no chat template
# variables): its resume reads them at their defaults instead of refusing them as unknown.
KEYS_AT_THEIR_DEFAULT_BEFORE = frozenset({"env.chat_template_kwargs"})

# What a resumed run may change: how long it runs, how it reports, where, on how many processes and in what
# precision it computes (a bf16 run resumed on an AVX2 machine goes on in fp32: model.autocast "auto"); not what
# it learns.
RESUME_OVERRIDES = frozenset({
    "run.steps", "run.save_every", "run.keep_last", "run.eval_every", "run.progress", "run.tensorboard", "run.plots",
    "run.overwrite_output_dir", "run.full_determinism", "model.device", "model.autocast", "env.eval_batch_size",
    "env.eval_samples", "run.log_completions",
    # A second evaluation under another prompt only reports; which evaluation's policy is kept as best_model only
    # saves a copy.
    "env.transfer_eval_kwargs", "env.transfer_eval_chat_template", "run.metric_for_best_model",
    "vllm.gpu_memory_utilization", "vllm.engine_kwargs",
    # Which engine samples follows the device, as the precision does ("auto": static on a GPU, hf on a CPU): a run
    # started on a CPU may go on on a GPU. Every engine samples the trainer's row seeds from the same policy.
    "rollout.backend", "static.decode_graph",
    # So does whether the training forwards run compiled layers ("auto": on a one-process GPU run): the same
    # log-probs up to float rounding.
    "model.compile_layers",
    # Alarms only watch the run.
    "run.stop_on_alarm", "alarms.entropy_collapse", "alarms.reward_stall", "alarms.window", "alarms.zero_std_groups",
    "alarms.clip_spike", "alarms.truncation", "alarms.eval_drop", "alarms.rollout_wait",
    "alarms.verifier_errors",
    # How far rollouts run ahead: a checkpoint's batches in flight, drawn under another value, are dropped (counted
    # in async/dropped_batches) and drawn again from its weights (algos/run/rollout_pipeline.py).
    "rollout.max_staleness",
    # Checkpoints (torch.distributed.checkpoint) load into any number of ranks, under either strategy.
    "distributed.world_size", "distributed.strategy", "distributed.backend", "distributed.timeout_s",
    # Split or not, a batch is drawn from the same seeds by the same weights (algos/run/rollout_pipeline.py).
    "distributed.rollout_ranks",
})


def _values_by_key(sections: dict[str, Any]) -> dict[str, Any]:
    """{"section.field": value} of a config's nested dict (a mapping field such as env.kwargs stays one value)."""
    return {f"{section}.{key}": value for section, fields in sections.items() for key, value in fields.items()}


def open_run_dir(config: Any, resume: bool) -> Path | None:
    """Prepare run.output_dir and write config.yaml into it; the checkpoint to resume from (None: start at step 0).

    A fresh start refuses a directory that holds checkpoints unless run.overwrite_output_dir (pruning would
    delete the new run's checkpoints in favour of the old, newer-numbered ones, and a later --resume would
    continue the old run); a resume checks the config against the checkpoint's (check_resumable)."""
    output_dir = Path(config.run.output_dir)
    latest = latest_checkpoint(output_dir)
    if latest is not None and not resume:
        _clear_for_a_fresh_start(config, output_dir, latest)
        latest = None
    if latest is not None:
        check_resumable(config, latest)
    elif resume:
        warnings.warn(f"--resume: no checkpoint in {output_dir}, starting at step 0", stacklevel=2)
    output_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, output_dir / "config.yaml")
    return latest


def _clear_for_a_fresh_start(config: Any, output_dir: Path, latest: Path) -> None:

    if not config.run.overwrite_output_dir:
        raise ValueError(
            f"run.output_dir {output_dir} holds {latest.name} of an earlier run: resume it (--resume), "
            "choose another run.output_dir, or set run.overwrite_output_dir to delete its checkpoints"
        )
    if resolve_model_path(config.model.path).resolve().is_relative_to(output_dir.resolve()):
        raise ValueError(f"model.path {config.model.path} is inside run.output_dir {output_dir}, whose checkpoints "
                         "run.overwrite_output_dir would delete: choose another run.output_dir")
    for checkpoint in list_checkpoints(output_dir):
        shutil.rmtree(checkpoint)
    shutil.rmtree(output_dir / WARM_START_DIR, ignore_errors=True)  # the earlier run's KL reference
    shutil.rmtree(output_dir / BEST_MODEL_DIR, ignore_errors=True)  # and its best model


def check_resumable(config: Any, checkpoint: Path) -> None:
    """Raise ValueError unless ``config`` continues what ``checkpoint`` was trained with (it may change only
    RESUME_OVERRIDES, and run.steps no lower than the steps trained); warn when nothing is left to train."""
    saved = checkpoint / ckpt.CONFIG_FILE
    if not saved.is_file():
        raise ValueError(f"cannot resume {checkpoint}: it holds no {ckpt.CONFIG_FILE}, the config it was trained with")
    raw = with_renamed_keys(load_file(saved))  # a checkpoint written before a key moved still resumes
    try:
        trained_with = _values_by_key(to_dict(from_dict(type(config), raw)))
    except ValueError as error:
        raise ValueError(f"cannot resume {checkpoint}: {saved} is not a {type(config).__name__} ({error})") from None
    given = _values_by_key(to_dict(config))
    stored = _values_by_key({section: fields for section, fields in raw.items() if isinstance(fields, dict)})
    unsaved_sections = (SECTIONS_OFF_BY_DEFAULT.keys() | ENGINE_SECTIONS.keys()) - raw.keys()
    switches = {key for section, key in SECTIONS_OFF_BY_DEFAULT.items() if section in unsaved_sections}  # at defaults
    trained_with.update({key: value for key, value in given.items()
                         if key.partition(".")[0] in unsaved_sections and key not in switches})
    if missing := sorted(key for key in given if key not in stored and key not in RESUME_OVERRIDES
                         and key not in KEYS_AT_THEIR_DEFAULT_BEFORE and key.partition(".")[0] not in unsaved_sections):
        raise ValueError(
            f"cannot resume {checkpoint}: {saved} has no {', '.join(missing)} (it was written before the key existed, "
            f"so what the run did there is unknown): add the value the run used to {saved}"
        )
    if changed := sorted(key for key in given if trained_with[key] != given[key] and key not in RESUME_OVERRIDES):
        listed = "; ".join(f"{key}: {trained_with[key]!r} -> {given[key]!r}" for key in changed[:8])
        raise ValueError(
            f"cannot resume {checkpoint} with a different config ({listed}). To continue the run as it was "
            f"configured, pass --config {saved}. A resumed run may change only {', '.join(sorted(RESUME_OVERRIDES))}"
        )
    trained = checkpoint_step(checkpoint)
    if trained > config.run.steps:
        raise ValueError(f"cannot resume {checkpoint} with run.steps = {config.run.steps}: it has trained {trained} steps")
    if trained == config.run.steps:
        warnings.warn(f"--resume: {checkpoint} already has run.steps = {trained} steps; nothing to train "
                      "(raise run.steps to continue)", stacklevel=2)
