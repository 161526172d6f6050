"""The verifiers in the calling conventions of TRL, verl and OpenRLHF."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .batch import score_batch
from .mathcheck import math_verifier
from .result import Verifier

# keyword arguments a verifier call sets itself (the Verifier contract's `completion` and `answer`,
# math_verifier's `timeout`): a dataset column of that name must not reach the verifier as info
RESERVED_INFO_KEYS = frozenset({"completion", "answer", "timeout"})


# Text that a decode with skip_special_tokens=False leaves after a response, as OpenRLHF decodes
# its queries: EOS and padding tokens such as <|im_end|>, <|endoftext|>, <|eot_id|>, DeepSeek's
# full-width <｜end▁of▁sentence｜>, </s>, <pad>, <eos>, Gemma's <end_of_turn>.
_SPECIAL_TOKEN_TEXT = re.compile(r"<\|[^<>|\s]{1,64}\|>|<｜[^<>｜\s]{1,64}｜>|</s>|<pad>|<eos>|<end_of_turn>")
_LONGEST_SPECIAL_TOKEN = 68  # "<|" + 64 characters + "|>"


def strip_trailing_special_tokens(text: str) -> str:
    """``text`` without the run of special-token text (EOS, padding) and whitespace at its end,
    which would otherwise end the final answer ("4.<|im_end|>") and fail its comparison."""
    end = len(text.rstrip())
    while end and text[end - 1] == ">":
        start = text.rfind("<", max(0, end - _LONGEST_SPECIAL_TOKEN), end)
        if start < 0 or not _SPECIAL_TOKEN_TEXT.fullmatch(text, start, end):
            break
        end = start
        while end and text[end - 1].isspace():  # by index: padding can be thousands of tokens long
            end -= 1
    return text[:end]


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
    the verifier as info. A row whose gold answer is None gets None: TRL's "this reward does not
    apply" (a multi-task dataset's rows of another task), which it leaves out of the reward sum.
    Picklable, and its `__name__` is what TRL logs the reward as.
    """

    # TRL's own extra keyword arguments; never passed on to a verifier as dataset columns
    _TRL_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments", "completion_ids")

    def __init__(self, verifier: Verifier = math_verifier, answer_column: str = "answer", name: str = "math_reward",
                 timeout: float | None = None):
        self.verifier = verifier
        self.answer_column = answer_column
        self.__name__ = name
        self.timeout = timeout

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        if self.answer_column not in kwargs:
            columns = sorted(k for k in kwargs if k not in self._TRL_KWARGS)
            raise KeyError(f"reward needs the dataset column {self.answer_column!r}; the batch has columns {columns}")
        answers = kwargs[self.answer_column]
        columns = _passable_info({k: v for k, v in kwargs.items() if k not in self._TRL_KWARGS})
        columns.pop(self.answer_column, None)
        infos = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        rows = [i for i, answer in enumerate(answers) if answer is not None]
        extra = {} if self.timeout is None else {"timeout": self.timeout}
        results = score_batch([completion_text(completions[i]) for i in rows], [answers[i] for i in rows],
                              verifier=self.verifier, infos=[infos[i] for i in rows], **extra)
        scores: list[float | None] = [None] * len(completions)
        for i, result in zip(rows, results):
            scores[i] = result.score
        return scores


def make_trl_reward(verifier: Verifier = math_verifier, answer_column: str = "answer", name: str = "math_reward",
                    timeout: float | None = None) -> TRLReward:
    """GRPOTrainer(reward_funcs=[make_trl_reward(answer_column="solution")], ...)."""
    return TRLReward(verifier, answer_column, name, timeout)


trl_reward_func = TRLReward()  # math_verifier against the dataset's "answer" column


def _gold_answers(ground_truth: Any, data_source: str) -> list:
    """verl's ground_truth as a list of accepted answers: one answer, or a list of them (a NumPy
    array once verl has read the dataset). A row without a usable answer is a broken dataset, not a
    wrong response, so it raises: verl's naive reward manager stops with the message, and the
    managers that catch a scorer's exceptions log it (a bare 0.0 would hide it)."""
    if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, str):  # a NumPy array or scalar
        ground_truth = ground_truth.tolist()
    golds = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    if not golds or any(gold is None or (isinstance(gold, str) and not gold.strip()) for gold in golds):
        raise ValueError(
            f"compute_score: ground_truth {ground_truth!r} (data_source {data_source!r}) has no usable answer: "
            "reward_model.ground_truth must be an answer or a non-empty list of accepted answers"
        )
    return golds


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **reward_kwargs: Any
) -> float:
    """verl's custom_reward_function: 1.0 if solution_str's final answer equals ground_truth, or any
    of its answers when it is a list (or NumPy array); ValueError when it holds none (None, empty).

    ``reward_kwargs`` (verl's ``custom_reward_function.reward_kwargs``, e.g. ``format_score``) are
    accepted so a verl config written for another scorer never makes this raise; they change nothing."""
    golds = _gold_answers(ground_truth, data_source)
    info = _passable_info(extra_info) if isinstance(extra_info, dict) else {}
    info.pop("data_source", None)  # passed explicitly below
    response = strip_trailing_special_tokens(solution_str) if isinstance(solution_str, str) else solution_str
    return max(math_verifier(response, answer=gold, data_source=data_source, **info).score for gold in golds)


def _response_of(query: str, prompt: str) -> str:
    """What follows the prompt in the query, without the EOS and padding text after it. A decoded query
    may start with a BOS or padding token's text that the prompt lacks, so the prompt is searched for;
    when it is not found the whole query is scored."""
    start = query.find(prompt)
    return strip_trailing_special_tokens(query[start + len(prompt) :] if start >= 0 else query)


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any) -> dict:
    """OpenRLHF's --remote_rm_url reward_func.py: queries are prompt + response, labels the gold answers.

    OpenRLHF decodes queries with skip_special_tokens=False, so each ends with its EOS (and, in
    padded batches, pad) token text; that is stripped before the response is scored.

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
