"""rlvr/MATH-v0: competition problems from a local MATH (Hendrycks) file.

Rows are the public format: ``{"problem", "solution" (with a final \\boxed{}),
"level": "Level 3", "type": "Algebra"}``; the MATH-500 shape (integer ``level``, ``"subject"``
for the type) works too. A non-empty ``"answer"`` field (MATH-500) wins over the solution's
final ``\\boxed{}`` answer, read as a prediction is: the boxes of the final sentence together
("$\\boxed{2}$ and $\\boxed{3}$" -> "2, 3").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewards.extract import final_boxed
from rlvr_env.answers import answer_reward, validate_answer_weights
from rlvr_env.data import DataFileError, DatasetTask, require_str
from rlvr_env.task import Problem, Task, TaskConfig, validate_flags, validate_prompt_template

ENV_VAR = "RLVR_MATH_PATH"
_LEVEL = re.compile(r"(?:Level\s+)?(\d+)")


def parse_level(value: Any) -> int | None:
    """MATH's "Level 3" or MATH-500's integer 3; None when absent or unknown (e.g. "Level ?")."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _LEVEL.fullmatch(value.strip()) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


@dataclass
class MATHConfig(TaskConfig):
    """``data_path``: .jsonl or .parquet (default: $RLVR_MATH_PATH). ``levels`` (1..5) and
    ``types`` ("Algebra", ...) keep only matching rows; empty keeps all. Answers are
    expressions, so the last-number fallback is off by default."""

    data_path: str | None = None
    levels: tuple[int, ...] = ()
    types: tuple[str, ...] = ()
    prompt_template: str = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    correct_weight: float = 1.0
    format_weight: float = 0.0
    fallback_last_number: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.levels = tuple(self.levels) if isinstance(self.levels, (list, tuple)) else self.levels
        self.types = tuple(self.types) if isinstance(self.types, (list, tuple)) else self.types

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.levels, tuple) or any(level not in (1, 2, 3, 4, 5) for level in self.levels):
            raise ValueError(f"levels must be a list of integers in 1..5, got {self.levels!r}")
        if not isinstance(self.types, tuple) or not all(isinstance(t, str) for t in self.types):
            raise ValueError(f"types must be a list of strings, got {self.types!r}")
        validate_prompt_template(self.prompt_template, "problem")
        validate_answer_weights(self.correct_weight, self.format_weight)
        validate_flags(fallback_last_number=self.fallback_last_number)


class MATHTask(DatasetTask, Task):
    config_cls = MATHConfig
    env_var = ENV_VAR

    def parse(self, records, path: Path, config: MATHConfig) -> list[Problem]:
        problems = []
        for line, record in records:
            text = require_str(record, "problem", path, line)
            level = parse_level(record.get("level"))
            kind = record.get("type") or record.get("subject")  # MATH-500 names the type "subject"
            if config.levels and level not in config.levels or config.types and kind not in config.types:
                continue
            answer = record.get("answer")
            answer = "" if answer is None else str(answer).strip()
            if not answer:  # no "answer" field, or a null/empty one (e.g. a partly-null parquet column)
                solution = require_str(record, "solution", path, line)
                # the final sentence's boxes, read as a prediction's are (a list when joined), except that
                # "\boxed{3} or \boxed{-3}" lists the answers instead of hedging between them
                boxed = final_boxed(solution, or_is_list=True)
                answer = boxed[0] if boxed else None
                if not answer:
                    raise DataFileError(
                        f"{path}:{line}: field 'solution' has no final \\boxed{{...}} answer "
                        "and field 'answer' is missing or empty"
                    )
            prompt = config.prompt_template.format(problem=text)
            problems.append(Problem(prompt, answer, {"line": line, "level": level, "type": kind}))
        return problems

    @property
    def verifier(self):
        cfg = self.config
        return answer_reward(cfg.correct_weight, cfg.format_weight, cfg.fallback_last_number)

    def gold_completion(self, problem: Problem) -> str:
        return f"The answer is \\boxed{{{problem.answer}}}."

    def curriculum_levels(self) -> list[dict[str, Any]]:
        return [{"levels": tuple(range(1, top + 1))} for top in range(1, 6)]
