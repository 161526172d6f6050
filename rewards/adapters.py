"""The verifiers in the calling conventions of TRL, verl, OpenRLHF, verifiers (PrimeIntellect) and slime.

verl's and OpenRLHF's loaders execute a file by path as a top-level module with no package
(``importlib.util.spec_from_file_location``); the docs point them at ``rewards/reward_file.py``, which
imports from here, and this file's imports are absolute so that it loads that way too. SkyRL-gym's
environment is in ``rlvr_env.skyrl_env`` (it needs skyrl_gym and builds rlvr_env's tasks).
"""

from __future__ import annotations

import asyncio
import math
import re
import warnings
from collections.abc import Sequence
from typing import Any

from rewards.batch import score_batch
from rewards.mathcheck import MathVerifier, math_verifier
from rewards.result import Verifier

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


def passable_info(info: dict) -> dict:
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


class MissingGoldWarning(UserWarning):
    """Rows reached a reward adapter without a gold answer: TRL gets None for them, OpenRLHF a 0.0 it logs."""


def is_blank_gold(gold: Any) -> bool:
    """Whether a gold answer is missing: None, a blank string, or NaN (pandas' missing value)."""
    if gold is None:
        return True
    if isinstance(gold, str):
        return not gold.strip()
    return isinstance(gold, float) and math.isnan(gold)


def _score_where_gold(completions: Sequence[Any], golds: Sequence[Any], *, infos: Sequence[dict] | None = None,
                      **batch_kwargs: Any) -> list:
    """score_batch's results for the rows that have a gold answer, None for the rows without one."""
    rows = [i for i, gold in enumerate(golds) if not is_blank_gold(gold)]
    results = score_batch([completions[i] for i in rows], [golds[i] for i in rows],
                          infos=None if infos is None else [infos[i] for i in rows], **batch_kwargs)
    scored = [None] * len(golds)
    for i, result in zip(rows, results):
        scored[i] = result
    return scored


class TRLReward:
    """A TRL `reward_funcs` entry: called as f(prompts=..., completions=..., completion_ids=..., **columns).

    `answer_column` names the dataset column holding the gold answers; other columns reach
    the verifier as info. A row whose gold answer is None or blank gets None: TRL's "this reward does not
    apply", which it leaves out of the reward sum (right for a multi-task dataset's rows of another task);
    a MissingGoldWarning says so, once. Picklable, and its `__name__` is what TRL logs the reward as.
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
        columns = passable_info({k: v for k, v in kwargs.items() if k not in self._TRL_KWARGS})
        columns.pop(self.answer_column, None)
        infos = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        extra = {} if self.timeout is None else {"timeout": self.timeout}
        results = _score_where_gold([completion_text(c) for c in completions], answers,
                                    verifier=self.verifier, infos=infos, **extra)
        if None in results:  # one constant message, so Python's default filter shows it once
            warnings.warn(f"reward {self.__name__!r}: rows whose {self.answer_column!r} is None or blank get None, "
                          "which TRL leaves out of the reward sum (right for a multi-task dataset's rows of "
                          "another task; otherwise the dataset lacks gold answers)", MissingGoldWarning, stacklevel=2)
        return [None if result is None else result.score for result in results]


def make_trl_reward(verifier: Verifier = math_verifier, answer_column: str = "answer", name: str = "math_reward",
                    timeout: float | None = None) -> TRLReward:
    """GRPOTrainer(reward_funcs=[make_trl_reward(answer_column="solution")], ...)."""
    return TRLReward(verifier, answer_column, name, timeout)


trl_reward_func = TRLReward()  # math_verifier against the dataset's "answer" column


def _gold_answers(ground_truth: Any, data_source: Any, field: str) -> list:
    """verl's ground_truth as a list of accepted answers: one answer, or a list of them (a NumPy
    array once verl has read the dataset). A row without a usable answer is a broken dataset, not a
    wrong response, so it raises, naming `field`: verl's naive, dapo and batch managers stop with the
    message, prime prints it (a bare 0.0 would hide it)."""
    if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, str):  # a NumPy array or scalar
        ground_truth = ground_truth.tolist()
    golds = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    if not golds or any(is_blank_gold(gold) for gold in golds):
        raise ValueError(
            f"compute_score: {field} = {ground_truth!r} (data_source {data_source!r}) has no usable answer: "
            "reward_model.ground_truth must be an answer or a non-empty list of accepted answers"
        )
    return golds


def _verl_scores(data_sources: Sequence, solution_strs: Sequence, ground_truths: Sequence, extra_infos: Sequence,
                 verifier: Verifier, batch: bool) -> list[float]:
    """Each response's score: 1.0 when its final answer equals any of its row's accepted answers."""
    accepted = [_gold_answers(gt, source, f"ground_truths[{i}]" if batch else "ground_truth")
                for i, (gt, source) in enumerate(zip(ground_truths, data_sources))]
    rows, responses, golds, infos = [], [], [], []
    for row, (response, answers, source, extra_info) in enumerate(
            zip(solution_strs, accepted, data_sources, extra_infos)):
        info = {**(passable_info(extra_info) if isinstance(extra_info, dict) else {}), "data_source": source}
        response = strip_trailing_special_tokens(response) if isinstance(response, str) else response
        for gold in answers:  # one check per accepted answer, all in one batch
            rows.append(row)
            responses.append(response)
            golds.append(gold)
            infos.append(info)
    scores = [0.0] * len(accepted)
    for row, result in zip(rows, score_batch(responses, golds, verifier=verifier, infos=infos)):
        scores[row] = max(scores[row], result.score)
    return scores


def compute_score(
    data_source: Any = None, solution_str: str | None = None, ground_truth: Any = None, extra_info: dict | None = None,
    *, data_sources: Sequence | None = None, solution_strs: Sequence[str] | None = None,
    ground_truths: Sequence | None = None, extra_infos: Sequence | None = None, backend: str = "native",
    **reward_kwargs: Any,
) -> float | list[float]:
    """verl's custom_reward_function, in both of the ways verl's reward managers call it:

    - per sample (naive, dapo, prime, the reward loop): ``compute_score(data_source=, solution_str=,
      ground_truth=, extra_info=)`` -> float;
    - batch (``reward_model.reward_manager=batch``): ``compute_score(data_sources=, solution_strs=,
      ground_truths=, extra_infos=)`` -> a list of floats.

    1.0 when the response's final answer equals ground_truth, or any of its answers when it is a list
    (or NumPy array); ValueError naming the sample when it holds none (None, blank, an empty list).

    ``backend``: the math checker, "native" or "math-verify" (math_verifier's; in verl,
    ``custom_reward_function.reward_kwargs.backend``). Other ``reward_kwargs`` (e.g. ``format_score``, and what
    verl's managers add) are accepted so a verl config written for another scorer never makes this raise;
    they change nothing."""
    verifier = MathVerifier(backend=backend)
    if solution_strs is None and ground_truths is None:
        return _verl_scores([data_source], [solution_str], [ground_truth], [extra_info], verifier, batch=False)[0]
    if solution_strs is None or ground_truths is None or solution_str is not None or ground_truth is not None:
        raise TypeError("compute_score takes solution_str and ground_truth (one sample) or solution_strs and "
                        "ground_truths (verl's batch reward manager), not a mix")
    count = len(solution_strs)
    data_sources = [None] * count if data_sources is None else data_sources
    extra_infos = [None] * count if extra_infos is None else extra_infos
    if not (len(ground_truths) == len(data_sources) == len(extra_infos) == count):
        raise ValueError(f"compute_score got {count} solution_strs, {len(ground_truths)} ground_truths, "
                         f"{len(data_sources)} data_sources and {len(extra_infos)} extra_infos")
    return _verl_scores(data_sources, solution_strs, ground_truths, extra_infos, verifier, batch=True)


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

    A sample without a label (None or blank: OpenRLHF passes "" for every sample when --label_key is not
    set) scores 0.0, is counted in extra_logs["missing_label"] (OpenRLHF logs each extra_logs key) and
    raises a MissingGoldWarning, so such a run shows it is training on no reward.

    Returns {"rewards", "scores", "extra_logs"} as OpenRLHF expects (torch tensors when torch is installed).
    """
    if not (len(queries) == len(prompts) == len(labels)):
        raise ValueError(f"reward_func got {len(queries)} queries, {len(prompts)} prompts, {len(labels)} labels")
    results = _score_where_gold([_response_of(q, p) for q, p in zip(queries, prompts)], list(labels))
    if None in results:
        warnings.warn("reward_func: samples without a label (None or blank; is --label_key set?) score 0.0, "
                      "counted in extra_logs['missing_label']", MissingGoldWarning, stacklevel=2)
    scores = [0.0 if r is None else r.score for r in results]
    logs = {"no_answer": [float(r is not None and r.status == "no_answer") for r in results],
            "missing_label": [float(r is None) for r in results]}
    try:
        import torch
    except ImportError:  # rewards never requires torch; plain lists work for callers without it
        return {"rewards": scores, "scores": scores, "extra_logs": logs}
    tensor = torch.tensor(scores, dtype=torch.float32)
    return {"rewards": tensor, "scores": tensor.clone(),
            "extra_logs": {key: torch.tensor(values) for key, values in logs.items()}}


async def verifiers_reward(completion: Any, answer: Any) -> float:
    """A verifiers (PrimeIntellect) Rubric reward function: ``vf.Rubric(funcs=[verifiers_reward])``.

    The Rubric passes the arguments this names: completion (text, or chat messages: the last assistant
    turn is scored) and the rollout's answer ("" when the dataset has none). The check runs in a thread,
    so a slow symbolic comparison never stalls the Rubric's event loop. A blank answer raises ValueError,
    which the Rubric logs as an error for that rollout (and scores 0.0)."""
    if is_blank_gold(answer):
        raise ValueError(f"verifiers_reward: the rollout's answer is {answer!r}: the dataset needs an 'answer' column")
    [result] = await asyncio.to_thread(score_batch, [completion_text(completion)], [answer])
    return result.score


async def slime_reward(args: Any, sample: Any, **kwargs: Any) -> float | list[float]:
    """slime's custom reward (``--custom-rm-path rewards.adapters.slime_reward``): slime awaits
    ``f(args, sample)`` for one Sample, or with ``--group-rm`` ``f(args, samples)`` for a group, which
    gets one float per sample. Scores ``sample.response`` against ``sample.label``, in a thread so the
    rollout's event loop keeps generating. A sample without a label (slime's is None unless
    ``--label-key`` is set) raises ValueError naming it, which stops the rollout with the message."""
    samples = sample if isinstance(sample, list) else [sample]
    for position, item in enumerate(samples):
        if is_blank_gold(item.label):
            raise ValueError(f"slime_reward: sample {item.index} (position {position} of {len(samples)}) has label "
                             f"{item.label!r}, no gold answer: set --label-key to the dataset's answer field")
    results = await asyncio.to_thread(score_batch, [s.response for s in samples], [s.label for s in samples])
    scores = [result.score for result in results]
    return scores if isinstance(sample, list) else scores[0]
