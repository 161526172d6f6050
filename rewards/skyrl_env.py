"""Deprecated: moved to ``rlvr_env.skyrl_env`` (rewards imports nothing first-party outside itself).

A re-export kept for one release; importing it warns once. Register ``rlvr_env.skyrl_env:RlvrTaskEnv`` instead.
"""

import warnings

warnings.warn("rewards.skyrl_env is deprecated and will be removed in the next release: "
              "import RlvrTaskEnv and skyrl_dataset_rows from rlvr_env.skyrl_env "
              '(entry_point="rlvr_env.skyrl_env:RlvrTaskEnv")', DeprecationWarning, stacklevel=2)

from rlvr_env.skyrl_env import RlvrTaskEnv, skyrl_dataset_rows  # noqa: E402

__all__ = ["RlvrTaskEnv", "skyrl_dataset_rows"]
