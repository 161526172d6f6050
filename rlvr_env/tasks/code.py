"""rlvr/Code-v0: write a Python function that passes unit tests, with a sandboxed Python tool.

Rows are MBPP's public format: ``{"task_id", "text", "code", "test_list", "test_setup_code"}``; the
default file, ``code_problems.jsonl`` beside this module, holds a few problems written for this
project in that format (MBPP's own file works as ``data_path=``). Reward: 1.0 when the last fenced
code block passes every test, else 0, run by :mod:`rewards.code` (``partial_credit=True``: the
fraction passed, which a constant function can farm; see rewards.code.CodeVerifier).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from rewards.code import CodeLimits, CodeVerifier
from rlvr_env.data import DataFileError, DatasetTask, require_str
from rlvr_env.multiturn_env import MultiTurnConfig, MultiTurnTask
from rlvr_env.task import Problem, validate_prompt_template
from rlvr_env.tools import Toolbox, python

ENV_VAR = "RLVR_CODE_PATH"
SAMPLE_PATH = Path(__file__).with_name("code_problems.jsonl")


@dataclass
class CodeConfig(MultiTurnConfig):
    """``data_path``: an MBPP-format .jsonl or .parquet (default: $RLVR_CODE_PATH, else the bundled sample).
    ``limits``: the sandbox's limits for scoring (rewards.code.CodeLimits fields, or one).
    ``partial_credit``: pay the fraction of tests passed instead of all or nothing (exploitable: a
    function returning a constant passes some tests; off by default, as in DeepCoder and verl)."""

    data_path: str | None = None
    prompt_template: str = (
        "{text}\nYour code should pass these tests:\n{tests}\n"
        "You can run code with the python tool. Give your final solution in one ```python code block."
    )
    limits: CodeLimits = field(default_factory=CodeLimits)
    partial_credit: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.limits, dict):  # gymnasium.make / YAML hand over a mapping
            self.limits = CodeLimits(**self.limits)

    def validate(self) -> None:
        super().validate()
        validate_prompt_template(self.prompt_template, "text", optional=("tests",))
        if not isinstance(self.limits, CodeLimits):
            raise ValueError(f"limits must be a CodeLimits or a mapping of its fields, got {self.limits!r}")
        if not isinstance(self.partial_credit, bool):
            raise ValueError(f"partial_credit must be true or false, got {self.partial_credit!r}")


class CodeTask(DatasetTask, MultiTurnTask):
    config_cls = CodeConfig
    env_var = ENV_VAR

    def _load(self, config: CodeConfig) -> list[Problem]:
        path = config.data_path or os.environ.get(ENV_VAR) or str(SAMPLE_PATH)
        return super()._load(dataclasses.replace(config, data_path=path))

    def parse(self, records, path: Path, config: CodeConfig) -> list[Problem]:
        problems = []
        for line, record in records:
            text = require_str(record, "text", path, line)
            tests = record.get("test_list")
            if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
                raise DataFileError(f"{path}:{line}: field 'test_list' must be a non-empty list of strings")
            setup = record.get("test_setup_code") or ""
            prompt = config.prompt_template.format(text=text, tests="\n".join(tests))
            answer = {"tests": tuple(tests), "setup": setup}
            problems.append(Problem(prompt, answer, {"line": line, "code": record.get("code")}))
        return problems

    @property
    def verifier(self):
        return CodeVerifier(self.config.limits, partial_credit=self.config.partial_credit)

    @property
    def tools(self) -> Toolbox:
        return Toolbox.of(python)

    def gold_completion(self, problem: Problem) -> str:
        return f"```python\n{problem.metadata['code']}\n```"
