"""The verifiers in the calling conventions of TRL, verl and OpenRLHF."""

from __future__ import annotations

from typing import Any, Sequence

from .batch import score_batch
from .mathcheck import math_verifier
from .result import Verifier

# keyword arguments a verifier call sets itself (the Verifier contract's `completion` and `answer`,
# math_verifier's `timeout`): a dataset column of that name must not reach the verifier as info
RESERVED_INFO_KEYS = frozenset({"completion", "answer", "timeout"})


def _passable_info(info: dict) -> dict:
    """`info` without reserved names or non-string keys, safe to pass on as **info."""
    return {k: v for k, v in info.items() if isinstance(k, str) and k not in RESERVED_INFO_KEYS}


def completion_text(completion: Any) -> str:
    """A completion as text: a string, or a chat message list (TRL's conversational format; last assistant turn)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
                content = message.get("content", "")
                if isinstance(content, list):  # multimodal parts: keep the text ones
                    return "".join(part.get("text", "") for part in content if isinstance(part, dict))
                return content if isinstance(content, str) else ""
        return ""
    raise TypeError(f"completion must be a string or a list of chat messages, got {type(completion).__name__}")


class TRLReward:
    """A TRL `reward_funcs` entry: called as f(prompts=..., completions=..., completion_ids=..., **columns).

    `answer_column` names the dataset column holding the gold answers; other columns reach
    the verifier as info. Picklable, and its `__name__` is what TRL logs the reward as.
    """

    # TRL's own extra keyword arguments; never passed on to a verifier as dataset columns
    _TRL_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments", "completion_ids")

    def __init__(self, verifier: Verifier = math_verifier, answer_column: str = "answer", name: str = "math_reward",
                 timeout: float | None = None):
        self.verifier = verifier
        self.answer_column = answer_column
        self.__name__ = name
        self.timeout = timeout

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        if self.answer_column not in kwargs:
            columns = sorted(k for k in kwargs if k not in self._TRL_KWARGS)
            raise KeyError(f"reward needs the dataset column {self.answer_column!r}; the batch has columns {columns}")
        answers = kwargs[self.answer_column]
        columns = _passable_info({k: v for k, v in kwargs.items() if k not in self._TRL_KWARGS})
        columns.pop(self.answer_column, None)
        infos = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        texts = [completion_text(c) for c in completions]
        extra = {} if self.timeout is None else {"timeout": self.timeout}
        results = score_batch(texts, answers, verifier=self.verifier, infos=infos, **extra)
        return [r.score for r in results]


def make_trl_reward(verifier: Verifier = math_verifier, answer_column: str = "answer", name: str = "math_reward",
                    timeout: float | None = None) -> TRLReward:
    """GRPOTrainer(reward_funcs=[make_trl_reward(answer_column="solution")], ...)."""
    return TRLReward(verifier, answer_column, name, timeout)


trl_reward_func = TRLReward()  # math_verifier against the dataset's "answer" column


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **reward_kwargs: Any
) -> float:
    """verl's custom_reward_function: 1.0 if solution_str's final answer equals ground_truth.

    ``reward_kwargs`` (verl's ``custom_reward_function.reward_kwargs``, e.g. ``format_score``) are
    accepted so a verl config written for another scorer never makes this raise; they change nothing."""
    info = _passable_info(extra_info) if isinstance(extra_info, dict) else {}
    info.pop("data_source", None)  # passed explicitly below
    return math_verifier(solution_str, answer=ground_truth, data_source=data_source, **info).score


def _response_of(query: str, prompt: str) -> str:
    """What follows the prompt in the query. A decoded query may start with a BOS token's text that the
    prompt lacks, so the prompt is searched for; when it is not found the whole query is scored."""
    start = query.find(prompt)
    return query[start + len(prompt) :] if start >= 0 else query


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any) -> dict:
    """OpenRLHF's --remote_rm_url reward_func.py: queries are prompt + response, labels the gold answers.

    Returns {"rewards", "scores", "extra_logs"} as OpenRLHF expects (torch tensors when torch is installed).
    """
    if not (len(queries) == len(prompts) == len(labels)):
        raise ValueError(f"reward_func got {len(queries)} queries, {len(prompts)} prompts, {len(labels)} labels")
    responses = [_response_of(q, p) for q, p in zip(queries, prompts)]
    results = score_batch(responses, list(labels))
    scores = [r.score for r in results]
    no_answer = [float(r.status == "no_answer") for r in results]
    try:
        import torch
    except ImportError:  # rewards never requires torch; plain lists work for callers without it
        return {"rewards": scores, "scores": scores, "extra_logs": {"no_answer": no_answer}}
    tensor = torch.tensor(scores, dtype=torch.float32)
    return {"rewards": tensor, "scores": tensor.clone(), "extra_logs": {"no_answer": torch.tensor(no_answer)}}
