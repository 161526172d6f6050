"""rlvr/Dataset-v0: your own file of prompts and reference answers, with no code to write.

The rows the other frameworks' users already have load as they are:

- TRL's: ``{"prompt": "..." or [{"role": "user", "content": "..."}], "solution": "..."}``
  (``answer_field: solution``; ``answer_in_boxed: true`` when it holds a worked solution ending in ``\\boxed{}``);
- verl's: ``{"prompt": [{"role": ..., "content": ...}], "reward_model": {"ground_truth": "..."}}``
  (``answer_field: reward_model.ground_truth``);
- plain: ``{"prompt": "...", "answer": "..."}`` (the defaults).

A prompt written as chat turns is the conversation the model reads (its own system turn, else the config's
``system_prompt``, then the config's ``few_shot`` pairs); a prompt written as text goes through
``prompt_template``. Completions are scored by the math verifier (``rewards.math_verifier``: the final
``\\boxed{}`` or "the answer is", compared as maths, text as text), as in MATH, or by a reward function of your own
(``verifier: "package.module:function"``, this project's signature, verl's ``compute_score`` or TRL's batched
reward function: rewards.imported), which gets the row's ``info_fields`` as keyword info (a TRL function: as
columns, with the answer under the answer field's name and the row's prompt as ``prompts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewards import WeightedSum
from rewards.extract import final_boxed
from rewards.imported import ImportedVerifier
from rlvr_env.answers import AnyAnswer, BoxedFormat, LenientAnswer, validate_answer_weights
from rlvr_env.data import DataFileError, DatasetTask
from rlvr_env.prompting import chat_turns
from rlvr_env.task import Problem, Task, TaskConfig, validate_flags, validate_prompt_template

ENV_VAR = "RLVR_DATASET_PATH"
ROLES = ("system", "user", "assistant")


@dataclass
class DatasetConfig(TaskConfig):
    """``data_path``: .jsonl or .parquet (default: $RLVR_DATASET_PATH). ``prompt_field`` and ``answer_field`` name the
    row's fields (a dotted name reaches into a nested one: verl's ``reward_model.ground_truth``)."""

    data_path: str | None = None
    prompt_field: str = "prompt"  # text, or chat turns [{role, content}, ...] (TRL's conversational rows, verl's)
    answer_field: str = "answer"  # the reference answer: a string or a number, or a list of accepted ones
    answer_in_boxed: bool = False  # the answer field is a worked solution: its final \boxed{} is the answer
    # A field holding a worked solution (TRL's "solution", MATH's) that the warm start imitates (the gold completion);
    # null: "The answer is \boxed{<answer>}."
    demonstration_field: str | None = None
    # A text prompt is shown through this ({prompt}: the row's text; literal braces doubled); chat turns as they are.
    prompt_template: str = "{prompt}"
    correct_weight: float = 1.0
    format_weight: float = 0.0  # credit for a filled \boxed{}, reported apart as "format"
    fallback_last_number: bool = False  # an answer without a marker is read as its last number (numeric answers)
    boxed_only: bool = False  # only a \boxed{} answer counts
    # "math": the math verifier, as MATH scores. "package.module:function": your own reward function, called as
    # function(completion, answer=..., **info), as verl's compute_score(data_source, solution_str, ground_truth,
    # extra_info) or as TRL's reward_func(completions, prompts, **columns) (e.g. "trl.rewards:accuracy_reward");
    # its answer is the row's answer field as it is (text, a number, a list or a mapping).
    verifier: str = "math"
    # Keyword arguments your verifier gets on every call (verl's custom_reward_function.reward_kwargs).
    verifier_kwargs: dict[str, Any] = field(default_factory=dict)
    # Row fields your verifier gets as keyword info, each under its last dotted part (verl's: [data_source, extra_info]).
    info_fields: tuple[str, ...] = ()
    # More reward functions ("package.module:function", any signature `verifier` takes), added to the score, each
    # reported as a component under its function's name: TRL's reward_funcs after the correctness one.
    reward_functions: tuple[str, ...] = ()
    # One weight for each of reward_functions (TRL's reward_weights); empty: 1.0 each.
    reward_weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("info_fields", "reward_functions", "reward_weights"):
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))

    def validate(self) -> None:
        super().validate()
        named = {"prompt_field": self.prompt_field, "answer_field": self.answer_field}
        if self.demonstration_field is not None:
            named["demonstration_field"] = self.demonstration_field
        for name, value in named.items():
            if not is_field_name(value):
                raise ValueError(f"{name} must be a field name (dotted for a nested field), got {value!r}")
        validate_prompt_template(self.prompt_template, "prompt")
        if self.verifier != "math":
            try:
                ImportedVerifier(self.verifier)
            except ValueError as error:
                raise ValueError(f"verifier must be 'math' or 'package.module:function': {error}") from None
            try:
                ImportedVerifier(self.verifier, self.answer_field.split(".")[-1], self.verifier_kwargs)
            except ValueError as error:
                raise ValueError(f"verifier_kwargs: {error}") from None
        elif self.verifier_kwargs:
            raise ValueError("verifier_kwargs go to a verifier of your own (verifier: 'package.module:function'); the "
                             "math verifier takes none")
        if not isinstance(self.info_fields, tuple) or not all(map(is_field_name, self.info_fields)):
            raise ValueError(f"info_fields must be a list of field names, got {self.info_fields!r}")
        if self.info_fields and self.verifier == "math" and not self.reward_functions:
            raise ValueError("info_fields go to a verifier of your own (verifier: 'package.module:function'); the math "
                             "verifier reads none")
        self._validate_reward_functions()
        validate_answer_weights(self.correct_weight, self.format_weight)
        validate_flags(answer_in_boxed=self.answer_in_boxed, fallback_last_number=self.fallback_last_number,
                       boxed_only=self.boxed_only)

    def _validate_reward_functions(self) -> None:
        if not isinstance(self.reward_functions, tuple):
            raise ValueError(f"reward_functions must be a list of 'package.module:function', got {self.reward_functions!r}")
        names = {"correct", "format"}  # the verifier's components
        for index, spec in enumerate(self.reward_functions):
            try:
                ImportedVerifier(spec)
            except ValueError as error:
                raise ValueError(f"reward_functions[{index}]: {error}") from None
            if component_name(spec) in names:
                raise ValueError(f"reward_functions[{index}] {spec!r}: its component name {component_name(spec)!r} is "
                                 f"taken (by 'correct', 'format' or an earlier function); wrap it under another name")
            names.add(component_name(spec))
        weights = self.reward_weights
        if not isinstance(weights, tuple) or any(isinstance(w, bool) or not isinstance(w, (int, float))
                                                 or not math.isfinite(w) for w in weights):
            raise ValueError(f"reward_weights must be a list of finite numbers, got {weights!r}")
        if weights and len(weights) != len(self.reward_functions):
            raise ValueError(f"reward_weights has {len(weights)} weights for {len(self.reward_functions)} "
                             f"reward_functions: give one each, or none (1.0 each)")


def component_name(spec: str) -> str:
    """The name a reward function's score is reported under: its own ("pkg.mod:Class.method" -> "method")."""
    return spec.rpartition(":")[2].rpartition(".")[2]


def is_field_name(value: Any) -> bool:
    """Whether ``value`` names a row's field: "answer", or dotted into nested ones, "reward_model.ground_truth"."""
    return isinstance(value, str) and all(value.split("."))


def field_value(record: dict[str, Any], dotted: str, path: Path, line: int) -> Any:
    """``record``'s value at ``dotted`` ("reward_model.ground_truth"), or a DataFileError naming what is missing."""
    value: Any = record
    for depth, key in enumerate(dotted.split(".")):
        if not isinstance(value, dict) or key not in value:
            where = ".".join(dotted.split(".")[:depth]) or "the row"
            fields = ", ".join(sorted(value)) if isinstance(value, dict) else type(value).__name__
            raise DataFileError(f"{path}:{line}: missing field {dotted!r} ({where} has: {fields})")
        value = value[key]
    return value


def chat_prompt(value: Any, field: str, path: Path, line: int) -> tuple[dict[str, str], ...]:
    """A prompt written as chat turns, checked: each a {role, content} of system/user/assistant; a user's first
    (after an optional system turn) and last."""
    turns = []
    for i, turn in enumerate(value):
        if not (isinstance(turn, dict) and turn.get("role") in ROLES and isinstance(turn.get("content"), str)):
            raise DataFileError(f"{path}:{line}: field {field!r} turn {i} must be {{role: system|user|assistant, "
                                f"content: text}}, got {turn!r}")
        turns.append({"role": turn["role"], "content": turn["content"]})
    question = turns[1:] if turns and turns[0]["role"] == "system" else turns
    if not question or question[0]["role"] != "user" or question[-1]["role"] != "user":
        raise DataFileError(f"{path}:{line}: field {field!r} must start (after a system turn) and end with a user turn, "
                            f"got roles {[turn['role'] for turn in turns]}")
    return tuple(turns)


def reference_answer(value: Any, config: DatasetConfig, path: Path, line: int) -> Any:
    """The row's answer as the verifier's gold: a non-empty string or a number, or a list of them (any of them is right:
    a tuple); a solution's final \\boxed{} with ``answer_in_boxed``. A verifier of your own gets any value but null as
    it is."""
    field = config.answer_field
    if config.answer_in_boxed:
        boxed = final_boxed(scalar_answer(value, field, path, line), or_is_list=True)  # \boxed{3} or \boxed{-3}: both
        if boxed is None:  # a blank box is none
            raise DataFileError(f"{path}:{line}: field {field!r} has no final \\boxed{{...}} answer (answer_in_boxed)")
        return boxed[0]
    if config.verifier != "math":
        if value is None:
            raise DataFileError(f"{path}:{line}: field {field!r} is null")
        return value
    if not isinstance(value, list):
        return scalar_answer(value, field, path, line)
    if not value:
        raise DataFileError(f"{path}:{line}: field {field!r} is an empty list of accepted answers")
    return tuple(scalar_answer(item, field, path, line) for item in value)


def scalar_answer(value: Any, field: str, path: Path, line: int) -> str:
    """One answer as text: a non-blank string or a number, or a DataFileError naming the row and the field."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise DataFileError(f"{path}:{line}: field {field!r} must be a non-empty string or a number, got {value!r}")
    return str(value).strip()


def worked_solution(record: dict[str, Any], field: str, path: Path, line: int) -> str:
    """The row's worked solution at ``field``: non-blank text, or a DataFileError naming the row and the field."""
    solution = field_value(record, field, path, line)
    if not isinstance(solution, str) or not solution.strip():
        raise DataFileError(f"{path}:{line}: field {field!r} must be a non-empty string (a worked solution), "
                            f"got {solution!r}")
    return solution


class DatasetRowsTask(DatasetTask, Task):
    config_cls = DatasetConfig
    env_var = ENV_VAR

    def parse(self, records, path: Path, config: DatasetConfig) -> list[Problem]:
        problems = []
        for line, record in records:
            prompt = field_value(record, config.prompt_field, path, line)
            answer = reference_answer(field_value(record, config.answer_field, path, line), config, path, line)
            metadata: dict[str, Any] = {"line": line}
            if config.demonstration_field:
                metadata["demonstration"] = worked_solution(record, config.demonstration_field, path, line)
            if config.info_fields:
                metadata["info"] = {name.split(".")[-1]: field_value(record, name, path, line) for name in config.info_fields}
            if isinstance(prompt, (list, tuple)):
                metadata["messages"] = chat_prompt(prompt, config.prompt_field, path, line)
                text = metadata["messages"][-1]["content"]
            elif isinstance(prompt, str) and prompt.strip():
                text = config.prompt_template.format(prompt=prompt)
            else:
                raise DataFileError(f"{path}:{line}: field {config.prompt_field!r} must be a non-empty string or a "
                                    f"list of chat turns, got {prompt!r}")
            problems.append(Problem(text, answer, metadata))
        return problems

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """The system prompt (a chat row's own system turn, else the config's), the few-shot pairs, then the row's
        question: its turns, or the templated text."""
        turns = problem.metadata.get("messages")
        if turns is None:
            return chat_turns(self.config.system_prompt, self.config.few_shot, problem.prompt)
        own_system = turns[0]["role"] == "system"
        system, question = (turns[0]["content"], turns[1:]) if own_system else (self.config.system_prompt, turns)
        lead = chat_turns(system, self.config.few_shot, question[0]["content"])  # ends with the row's first user turn
        return [*lead, *(dict(turn) for turn in question[1:])]

    def verifier_info(self, problem: Problem) -> dict[str, Any]:
        """The row's ``info_fields``; with a TRL reward function also its ``prompt`` (chat turns, or the text asked),
        which TRL passes as ``prompts`` and which makes the completions chat messages when it is turns."""
        info = dict(problem.metadata.get("info", {}))
        if any(function.convention == "trl" for function in self._imported_functions()):
            turns = problem.metadata.get("messages")
            info["prompt"] = problem.prompt if turns is None else [dict(turn) for turn in turns]
        return info

    def _imported(self, spec: str, kwargs: dict[str, Any] | None = None) -> ImportedVerifier:
        """A configured reward function, reading the answer from the column the answer field names."""
        return ImportedVerifier(spec, answer_column=self.config.answer_field.split(".")[-1], kwargs=kwargs or {})

    def _imported_functions(self) -> list[ImportedVerifier]:
        specs = self.config.reward_functions if self.config.verifier == "math" else (self.config.verifier,
                                                                                      *self.config.reward_functions)
        return [self._imported(spec) for spec in specs]

    @property
    def verifier(self):
        """"correct" (the math verifier, the best over a row's accepted answers, or your own), "format" when weighted,
        then each of reward_functions under its own name."""
        cfg = self.config
        correct = (AnyAnswer(LenientAnswer(cfg.fallback_last_number, boxed_only=cfg.boxed_only))
                   if cfg.verifier == "math" else self._imported(cfg.verifier, cfg.verifier_kwargs))
        parts = [("correct", correct, cfg.correct_weight)]
        if cfg.format_weight:
            parts.append(("format", BoxedFormat(), cfg.format_weight))
        weights = cfg.reward_weights or (1.0,) * len(cfg.reward_functions)
        parts += [(component_name(spec), self._imported(spec), weight)
                  for spec, weight in zip(cfg.reward_functions, weights)]
        return WeightedSum(parts)

    def gold_completion(self, problem: Problem) -> str:
        """The row's worked solution (demonstration_field), else the bare boxed answer."""
        first = problem.answer[0] if isinstance(problem.answer, tuple) else problem.answer
        return problem.metadata.get("demonstration") or f"The answer is \\boxed{{{first}}}."
