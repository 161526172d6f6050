"""The rollout engines a run can name in rollout.backend, registered by name (ROLLOUT_ENGINES): each engine's own
module registers it (static.py, vllm.py; "hf" in multiturn.py, whose multi-turn rollout extends hf.py's), and this
package imports them all. make_rollout_backend builds the one a config names, resolve_rollout_backend picks one for
"auto"."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from algos.config import ENGINE_SECTIONS
from algos.core.variants import Registry
from algos.rollout.environment import is_multiturn_task
from algos.system.runtime import resolve_device

log = logging.getLogger("rlvr")


@dataclass(frozen=True)
class RolloutEngine:
    """A rollout engine a run can name in rollout.backend.

    ``build(config, sampling, multiturn)`` returns the RolloutBackend sampling as ``sampling`` (temperature, top_p,
    top_k) says; ``multiturn``: the task's rollouts are whole episodes (only where ``plays_multiturn``).
    ``own_weights``: it samples from its own copy of the policy, refreshed from the trainer's, whose log-probs can
    differ from the trainer's (grpo.rollout_correction "auto" then corrects them). ``requires``: a module it
    imports, checked before a run loads its model, with ``install`` saying how to get it. ``refuses``: a model's
    transformers config -> why the engine cannot sample that model exactly, or None (every model).
    ``samples_while_training``: it can sample on a thread of its own, from a copy of the policy, while the learner
    updates (rollout.max_staleness >= 1: algos/run/rollout_pipeline.py, which deepcopies the backend for its actor;
    an engine that cannot be duplicated answers the copy with itself and serializes its calls, as vllm.py's does).
    ``section``: the dataclass of the engine's own keys (static.py's StaticEngineConfig), the config's top-level
    section named as the engine, each field commented, its validate() naming each key in full ("vllm.dtype");
    ``build`` reads it as ``config.engine_sections[name]``."""
    build: Callable[[Any, dict[str, Any], bool], Any]
    plays_multiturn: bool = False
    own_weights: bool = False
    requires: str | None = None
    install: str = ""
    refuses: Callable[[Any], str | None] | None = None
    samples_while_training: bool = False
    section: type | None = None

    def check_available(self, name: str) -> None:
        """ValueError naming rollout.backend when what the engine imports is not installed."""
        if self.requires is not None and importlib.util.find_spec(self.requires) is None:
            raise ValueError(f"config rollout.backend = {name!r} needs {self.requires}: {self.install}")


class EngineRegistry(Registry):
    """rollout.backend -> its RolloutEngine; registering one records its section in algos.config.ENGINE_SECTIONS,
    whence config files, --key overrides, `rlvr train --help`, config.yaml and --resume read it (the config layer
    cannot import the engines)."""

    def register(self, name: str, engine: RolloutEngine) -> RolloutEngine:
        super().register(name, engine)
        if engine.section is not None:
            ENGINE_SECTIONS.register(name, engine.section)
        return engine


# rollout.backend -> its engine. A new engine is one registration (ROLLOUT_ENGINES.register("name", RolloutEngine(...)))
# in a module imported before the run starts: config validation, the run's checks and the rollout correction read it.
ROLLOUT_ENGINES = EngineRegistry("rollout.backend")


def resolve_rollout_backend(config, device: torch.device) -> str:
    """Resolve rollout.backend "auto" in place (so config.yaml records what ran): "static" on a GPU (its decode is
    launch-bound in "hf": docs/performance.md; a multi-turn task's turns through the episode driver), else "hf";
    returns the name."""
    if config.rollout.backend == "auto":
        config.rollout.backend = "static" if device.type == "cuda" else "hf"
    return config.rollout.backend


def engine_for_model(config, model_config) -> str:
    """rollout.backend once the model is known, for a run whose "auto" picked ``config.rollout.backend``: an engine
    that refuses this model (its ``refuses``) gives way to "hf", with one warning saying why; set in place."""
    engine = ROLLOUT_ENGINES[config.rollout.backend]
    why = engine.refuses(model_config) if engine.refuses is not None else None
    if why is not None:
        log.warning(f"rollout.backend 'auto' -> 'hf' instead of {config.rollout.backend!r}: {why}")
        config.rollout.backend = "hf"
    return config.rollout.backend


def make_rollout_backend(config):
    """The rollout backend of the engine config.rollout.backend names (ROLLOUT_ENGINES), sampling as config.rollout
    says; on a multi-turn task (is_multiturn_task) it plays whole episodes.

    The built-in engines draw from torch's global RNG (HFRollout its samples, VLLMRollout its per-row seeds),
    which checkpoints save, so resumed runs sample the same tokens.
    """
    cfg = config.rollout
    if cfg.backend == "auto":
        resolve_rollout_backend(config, resolve_device(config.model.device))
    engine = ROLLOUT_ENGINES[cfg.backend]
    multiturn = is_multiturn_task(config.env.id)
    if multiturn and not engine.plays_multiturn:
        players = [name for name, other in ROLLOUT_ENGINES.items() if other.plays_multiturn]
        raise ValueError(f"config rollout.backend = {cfg.backend!r}: {config.env.id} is a multi-turn task, whose "
                         f"episodes only {', '.join(map(repr, players))} play (algos/rollout/multiturn.py); set rollout.backend "
                         f"= {players[0]!r}")
    return engine.build(config, {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k}, multiturn)
