"""Reasoning tasks as Gymnasium environments.

``import rlvr_env`` registers the built-in tasks (``rlvr/Arithmetic-v0``,
``rlvr/Countdown-v0``, ``rlvr/GSM8K-v0``, ``rlvr/MATH-v0``, ``rlvr/Dataset-v0`` (your own file), and the multi-turn
``rlvr/CalculatorArithmetic-v0``, ``rlvr/Code-v0``, ``rlvr/GuessNumber-v0``); reasoning-gym
datasets are registered by :func:`register_reasoning_gym`. TokenVectorEnv
imports torch on first use only, so the text-level envs work without it.
"""

from rlvr_env.completion_env import CompletionEnv
from rlvr_env.curriculum import Curriculum, CurriculumWrapper
from rlvr_env.multiturn_env import MultiTurnConfig, MultiTurnEnv, MultiTurnTask, Reply
from rlvr_env.registry import make_task, register_reasoning_gym, register_task, registered_tasks
from rlvr_env.task import Problem, Task, TaskConfig
from rlvr_env.tasks.arithmetic import ArithmeticTask
from rlvr_env.tasks.calculator_arithmetic import CalculatorArithmeticTask
from rlvr_env.tasks.code import CodeTask
from rlvr_env.tasks.competition_math import MATHTask
from rlvr_env.tasks.countdown import CountdownTask
from rlvr_env.tasks.dataset import DatasetRowsTask
from rlvr_env.tasks.gsm8k import GSM8KTask
from rlvr_env.tasks.guess_number import GuessNumberTask
from rlvr_env.token_env import TokenEnv
from rlvr_env.tools import Tool, Toolbox

register_task("Arithmetic", ArithmeticTask)
register_task("Countdown", CountdownTask)
register_task("GSM8K", GSM8KTask)
register_task("MATH", MATHTask)
register_task("Dataset", DatasetRowsTask)
register_task("CalculatorArithmetic", CalculatorArithmeticTask)  # multi-turn ids: gymnasium.make gives a MultiTurnEnv
register_task("Code", CodeTask)
register_task("GuessNumber", GuessNumberTask)

_TORCH_VIEWS = {
    "TokenVectorEnv": "rlvr_env.token_vector_env",
    "RolloutResult": "rlvr_env.token_vector_env",
}


def __getattr__(name: str):
    # TokenVectorEnv keeps its state in torch tensors; import torch only when it is asked for.
    if name in _TORCH_VIEWS:
        import importlib

        return getattr(importlib.import_module(_TORCH_VIEWS[name]), name)
    raise AttributeError(f"module 'rlvr_env' has no attribute {name!r}")


__all__ = [
    "ArithmeticTask",
    "CalculatorArithmeticTask",
    "CodeTask",
    "CompletionEnv",
    "CountdownTask",
    "Curriculum",
    "CurriculumWrapper",
    "GSM8KTask",
    "GuessNumberTask",
    "MATHTask",
    "MultiTurnConfig",
    "MultiTurnEnv",
    "MultiTurnTask",
    "Problem",
    "Reply",
    "RolloutResult",
    "Task",
    "TaskConfig",
    "TokenEnv",
    "TokenVectorEnv",
    "Tool",
    "Toolbox",
    "make_task",
    "register_reasoning_gym",
    "register_task",
    "registered_tasks",
]
