"""The agents and everything they train on, in layers that import downward only (pyproject.toml's import-linter
contracts): cli > algorithms > run > learn | rollout > model > system > config > core.

The modules that sat flat in this package until 0.5 still import under their old names for one release (e.g.
``algos.grpo`` is ``algos.algorithms.grpo``, the same module object), with one FutureWarning naming the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

# old module -> where it lives now (one module, or the modules a split one's names went to)
MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "algos.alarms": ("algos.run.alarms",),
    "algos.checkpoint": ("algos.run.checkpoint", "algos.system.paths"),
    "algos.distributed": ("algos.system.distributed",),
    "algos.dpo": ("algos.algorithms.dpo",),
    "algos.environment": ("algos.rollout",),
    "algos.evaluation": ("algos.run.evaluation",),
    "algos.grpo": ("algos.algorithms.grpo",),
    "algos.hardware": ("algos.system.hardware",),
    "algos.memory": ("algos.system.memory",),
    "algos.metrics": ("algos.run.metrics", "algos.rollout.metrics", "algos.learn.stats"),
    "algos.models": ("algos.model.loading",),
    "algos.multiturn": ("algos.rollout.multiturn",),
    "algos.policy": ("algos.model.policy",),
    "algos.ppo": ("algos.algorithms.ppo",),
    "algos.reward_model": ("algos.model.reward",),
    "algos.run_dir": ("algos.run.directory",),
    "algos.runtime": ("algos.system.runtime",),
    "algos.sft": ("algos.run.warm_start",),
    "algos.static_rollout": ("algos.rollout.static",),
    "algos.trainer": ("algos.run.loop",),
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module it moved to (a split module: one holding all their names)."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec):
        return None  # the default module, replaced in sys.modules by exec_module

    def exec_module(self, module) -> None:
        targets = MOVED_MODULES[module.__name__]
        warnings.warn(f"{module.__name__} moved to {' and '.join(targets)}; the old path goes away in the next release",
                      FutureWarning, stacklevel=2)
        if len(targets) == 1:
            sys.modules[module.__name__] = importlib.import_module(targets[0])
            return
        merged = types.ModuleType(module.__name__, f"{module.__name__}: the names of {', '.join(targets)}")
        for target in map(importlib.import_module, targets):
            merged.__dict__.update({k: v for k, v in vars(target).items() if not k.startswith("__")})
        sys.modules[module.__name__] = merged


sys.meta_path.append(_MovedModules())
