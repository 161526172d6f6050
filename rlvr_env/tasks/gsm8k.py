"""rlvr/GSM8K-v0: grade-school word problems from a local GSM8K file.

Rows are the public format: ``{"question": ..., "answer": "...reasoning...\\n#### 42"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlvr_env.answers import AnswerTask, validate_answer_weights
from rlvr_env.data import DataFileError, DatasetTask, require_str
from rlvr_env.prompting import validate_few_shot_keep
from rlvr_env.task import Problem, TaskConfig, validate_flags, validate_prompt_template

ENV_VAR = "RLVR_GSM8K_PATH"


@dataclass
class GSM8KConfig(TaskConfig):
    """``data_path``: a .jsonl or .parquet file (default: $RLVR_GSM8K_PATH). Reward as in
    Arithmetic: ``correct_weight`` for the right number (last number as fallback when
    ``fallback_last_number``, the usual GSM8K grading) plus ``format_weight`` for ``\\boxed{}``.
    ``few_shot_keep``: the chance each ``few_shot`` example is shown in a prompt (1 = all, 0 = zero-shot),
    drawn per problem (rlvr_env.prompting.shown_few_shot); a trainer's ``env.schedule`` fades it out."""

    data_path: str | None = None
    prompt_template: str = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    correct_weight: float = 1.0
    format_weight: float = 0.0
    fallback_last_number: bool = True
    literal_answer: bool = True  # the value as a number: "86 + 67" or \frac{306}{2} for 153 scores 0
    boxed_only: bool = False  # only a \boxed{} answer counts ("The answer is 5", a bare "5" and the last number score 0)
    few_shot_keep: float = 1.0  # chance each few-shot example is shown (per problem): 1 = all, 0 = none

    def validate(self) -> None:
        super().validate()
        validate_prompt_template(self.prompt_template, "question")
        validate_answer_weights(self.correct_weight, self.format_weight)
        validate_flags(fallback_last_number=self.fallback_last_number, literal_answer=self.literal_answer,
                       boxed_only=self.boxed_only)
        validate_few_shot_keep(self.few_shot_keep)


def final_answer(solution: str) -> str | None:
    """The number after GSM8K's last ``####`` marker, thousands separators removed."""
    if "####" not in solution:
        return None
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    return answer or None


class GSM8KTask(DatasetTask, AnswerTask):
    config_cls = GSM8KConfig
    env_var = ENV_VAR

    def parse(self, records, path: Path, config: GSM8KConfig) -> list[Problem]:
        problems = []
        for line, record in records:
            question = require_str(record, "question", path, line)
            answer = final_answer(require_str(record, "answer", path, line))
            if answer is None:
                raise DataFileError(f"{path}:{line}: field 'answer' has no final '#### <number>'")
            prompt = config.prompt_template.format(question=question)
            problems.append(Problem(prompt, answer, {"line": line}))
        return problems

    def gold_completion(self, problem: Problem) -> str:
        return f"The answer is \\boxed{{{problem.answer}}}."
