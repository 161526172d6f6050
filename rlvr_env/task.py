"""The task contract: a problem source plus a verifier.

A task turns ``(index, seed)`` into a :class:`Problem` deterministically, so item
``i`` can be fetched without generating items ``0..i-1``, and scores a completion
through its picklable verifier from :mod:`rewards`, the one scoring hook every view
calls (batch scoring may run it in worker processes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rewards.result import VerifyResult


@dataclass(frozen=True)
class Problem:
    """One item of a task: the user-facing prompt text, the gold answer the verifier
    compares against, and task-specific facts (index, difficulty, source line...)."""

    prompt: str
    answer: Any
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskConfig:
    """Prompt settings every task shares; subclasses add their own knobs.

    ``system_prompt`` becomes the system turn in chat form (prepended in plain
    text); ``few_shot`` holds ``(prompt, completion)`` pairs shown before the
    problem as earlier user/assistant turns.
    """

    system_prompt: str | None = None
    few_shot: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        # gymnasium.make / YAML hand over lists; keep the config hashable and uniform.
        if isinstance(self.few_shot, (list, tuple)):
            self.few_shot = tuple(tuple(pair) if isinstance(pair, (list, tuple)) else pair for pair in self.few_shot)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError(f"system_prompt must be a string or None, got {type(self.system_prompt).__name__}")
        if not isinstance(self.few_shot, tuple):
            raise ValueError(f"few_shot must be a list of (prompt, completion) pairs, got {type(self.few_shot).__name__}")
        for i, pair in enumerate(self.few_shot):
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
                raise ValueError(f"few_shot[{i}] must be a (prompt, completion) pair of strings, got {pair!r}")


def build_config(config_cls: type[TaskConfig], base: TaskConfig | None, changes: dict[str, Any]) -> TaskConfig:
    """A validated ``config_cls`` from ``base`` (or the defaults) with ``changes`` applied."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field {unknown[0]!r}; fields: {', '.join(sorted(known))}")
    if base is not None and not isinstance(base, config_cls):
        raise ValueError(f"config must be a {config_cls.__name__}, got {type(base).__name__}")
    config = dataclasses.replace(base, **changes) if base is not None else config_cls(**changes)
    config.validate()
    return config


def validate_prompt_template(template: str, *required: str, optional: tuple[str, ...] = ()) -> None:
    """Raise ValueError naming prompt_template unless it contains every ``{required}`` placeholder and
    formats with those and the ``optional`` ones alone (literal braces doubled, as in ``\\boxed{{}}``):
    a stray brace would otherwise fail at load time."""
    names = ", ".join("{" + name + "}" for name in (*required, *optional))
    try:
        template.format(**{name: "x" for name in (*required, *optional)})
    except (KeyError, IndexError, ValueError, AttributeError) as error:
        raise ValueError(f"prompt_template must format with only {names} (braces doubled): {error!r}") from None
    for name in required:
        if "{" + name + "}" not in template:
            raise ValueError(f"prompt_template must contain {{{name}}}")


def validate_flags(**flags: Any) -> None:
    """Reject non-bool flags by name: a YAML/CLI string "false" would otherwise read as true."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")


def solved(score, components):
    """Whether a result counts as solved: its "correct" component when the verifier reports one (scores may
    include format credit), else its score, at full credit (partial credit, e.g. reasoning-gym's 0.65, is not
    solved). Takes floats (-> bool) or a batch's Float[B] scores and components (-> Bool[B])."""
    return components.get("correct", score) >= 1.0


class Task:
    """Base class of every task. Subclasses set ``config_cls`` and implement
    ``problem``, ``verifier`` and ``gold_completion``."""

    config_cls: ClassVar[type[TaskConfig]] = TaskConfig

    def __init__(self, config: TaskConfig | None = None, **kwargs: Any) -> None:
        self.config = build_config(self.config_cls, config, kwargs)

    def configure(self, **changes: Any) -> bool:
        """Change config fields (e.g. difficulty) in place, validated like the constructor;
        True when the config actually changed."""
        config = build_config(self.config_cls, self.config, changes)
        changed, self.config = config != self.config, config
        return changed

    @property
    def size(self) -> int | None:
        """Number of distinct problems, or None for procedural tasks."""
        return None

    def problem(self, index: int, seed: int) -> Problem:
        raise NotImplementedError

    @property
    def verifier(self):
        """A picklable ``(completion, *, answer, **info) -> VerifyResult`` for this task's problems, called with
        ``answer=problem.answer`` and ``verifier_info(problem)``; ``details["components"]`` holds each part's score.
        Every view scores through it."""
        raise NotImplementedError

    def verifier_info(self, problem: Problem) -> dict[str, Any]:
        """Keyword info the verifier gets beside ``problem``'s answer: every view scores a completion as
        ``task.verifier(completion, answer=problem.answer, **task.verifier_info(problem))``. {} unless the verifier
        reads more of the problem (Dataset's ``info_fields``)."""
        return {}

    def verify(self, completion: str, problem: Problem) -> VerifyResult:
        """``completion`` scored as an answer to ``problem``, the way every view scores one (one completion at a time;
        TokenVectorEnv passes the same answers and info to rewards.score_batch)."""
        return self.verifier(completion, answer=problem.answer, **self.verifier_info(problem))

    def gold_completion(self, problem: Problem) -> str:
        """A completion that must score 1.0 (the gold self-test)."""
        raise NotImplementedError

    def gold_messages(self, problem: Problem) -> list[dict[str, str]]:
        """A demonstration of ``problem``: the messages a solved episode adds after ``messages(problem)``, the
        assistant's and what the environment answers between them (a MultiTurnTask's tool outputs or replies); what
        the trainers' warm start (algos/run/warm_start.py) imitates. By default the gold completion, as one assistant message."""
        return [{"role": "assistant", "content": self.gold_completion(problem)}]

    @property
    def process_step_end(self) -> str | None:
        """The text that ends one reasoning step (e.g. ``"\\n"``) when the task gives per-step
        process rewards; None (the default) for the outcome reward only."""
        return None

    def process_reward(self, problem: Problem, text_so_far: str) -> float:
        """Reward for the last reasoning step of ``text_so_far``, which ends with that step
        (a ``process_step_end``, or the completion's end). The token envs call it once per step,
        when the token that ends the step is generated, and add it to that token's reward."""
        raise NotImplementedError(f"{type(self).__name__} sets process_step_end but not process_reward")

    def is_success(self, result: VerifyResult) -> bool:
        """Whether a result counts as solved (curriculum, CompletionEnv's info): see :func:`solved`."""
        return bool(solved(result.score, result.details.get("components", {})))

    def curriculum_levels(self) -> list[dict[str, Any]]:
        """Config changes from easiest to hardest, for CurriculumWrapper; empty if none."""
        return []

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """The chat turns for ``problem``: system prompt, few-shot pairs, then the problem."""
        turns = [{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else []
        for prompt, completion in self.config.few_shot:
            turns += [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        return turns + [{"role": "user", "content": problem.prompt}]
