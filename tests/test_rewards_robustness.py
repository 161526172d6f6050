"""Regressions from a review of rewards/: quadratic extraction, markdown markers, NumPy golds,
adapter keyword collisions, verifiers a pool worker cannot load, OpenRLHF's special-token text,
verl's list ground truths."""

import time

import numpy as np
import pytest

from rewards import VerifyResult, WeightedSum, extract_answer, format_reward, math_verifier, score_batch
from rewards.adapters import compute_score, make_trl_reward, reward_func, strip_trailing_special_tokens

# Each took 0.6-15 s before extraction was made linear (the default path runs in-process, no time limit).
ADVERSARIAL = {
    "repeated marker": ("answer: " * 4000 + "5", "5"),
    "unclosed \\(": ("The answer is " + "\\(" * 15000, None),
    "unclosed \\[ after a box": ("\\boxed{5} Final answer " + "\\[" * 15000, None),
    "copulas between dollars": ("The answer is " + "x is $ " * 9000 + "5", "$ x is $ 5"),
    "unclosed <answer>": ("<answer>" * 8000, None),
}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_extraction_is_linear_on_adversarial_responses(name):
    text, expected = ADVERSARIAL[name]
    start = time.perf_counter()
    answer = extract_answer(text)
    assert time.perf_counter() - start < 0.5
    if expected is not None:
        assert answer == expected


def test_repeated_marker_scores_fast_through_score_batch():
    start = time.perf_counter()
    [result] = score_batch(["answer: " * 4000 + "5"], ["5"], timeout=1.0)
    assert time.perf_counter() - start < 0.5
    assert (result.score, result.status) == (1.0, "ok")


@pytest.mark.parametrize("text, expected", [
    ("Final Answer: The final answer is 28", "28"),  # the innermost statement, as before
    ("The answer is $x$ is 5", "5"),
    ("The value is $\\frac{1}{2}$ cups", "\\frac{1}{2}"),
    ("$a$$b$ is the answer", "$a$$b$ is the answer"),
    ("<answer><answer>3</answer> <answer>4", "<answer>3"),
    ("x <answer>3</answer> y <answer>4</answer>", "4"),
])
def test_linear_extraction_keeps_the_answers(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text", [
    "**Answer:** 73", "**Final Answer:** 73", "**Final Answer**: 73", "**Answer**: $73$",
    "Answer: **73**", "The answer is **73**.", "*Answer:* 73",
])
def test_markdown_bold_answer_markers(text):
    assert math_verifier(text, answer="73").score == 1.0


@pytest.mark.parametrize("gold, completion", [
    (np.float64(72.0), "\\boxed{72}"), (np.int64(72), "\\boxed{72}"), (np.float32(0.5), "\\boxed{\\frac12}"),
    (np.int32(-3), "#### -3"), (72.0, "\\boxed{72}"),
])
def test_numpy_scalar_golds(gold, completion):
    result = math_verifier(completion, answer=gold)
    assert (result.score, result.status) == (1.0, "ok")
    assert math_verifier("\\boxed{71}", answer=gold).score == 0.0


def test_bool_gold_is_still_an_error():
    assert math_verifier("\\boxed{1}", answer=True).status == "error"


def test_trl_answer_column_beside_an_answer_column():
    reward = make_trl_reward(answer_column="solution")
    scores = reward(prompts=["p", "p"], completions=["\\boxed{4}", "\\boxed{5}"], completion_ids=[[1], [2]],
                    solution=["4", "4"], answer=["5", "5"], completion=["x", "y"], timeout=[0, 0], level=[1, 2])
    assert scores == [1.0, 0.0]


@pytest.mark.parametrize("extra_info", [
    {"completion": "c"}, {"answer": "5", "timeout": 0}, {"data_source": "other", "index": 3}, {1: "x"}, "not a dict",
])
def test_verl_extra_info_never_raises(extra_info):
    assert compute_score("gsm8k", "\\boxed{4}", "4", extra_info) == 1.0


def _reward_defined_in_main(completion, *, answer, **info):
    return VerifyResult(float(answer in completion))


_reward_defined_in_main.__module__ = "__main__"  # as if defined in the training script


@pytest.mark.parametrize("verifier", [
    _reward_defined_in_main,
    lambda completion, **info: 1.0,
    WeightedSum([("correct", math_verifier, 1.0), ("mine", _reward_defined_in_main, 0.1)]),
])
def test_pool_refuses_a_verifier_workers_cannot_load(verifier):
    with pytest.raises(ValueError, match=r"verifier .*importable module.*workers=0"):
        score_batch(["\\boxed{4}"], ["4"], verifier=verifier, workers=1)


def test_unloadable_verifier_still_runs_in_process():
    [result] = score_batch(["\\boxed{4}"], ["4"], verifier=_reward_defined_in_main, workers=0)
    assert result.score == 1.0


def test_pool_accepts_importable_verifiers():
    reward = WeightedSum([("correct", math_verifier, 1.0), ("format", format_reward(), 0.1)])
    assert score_batch([], [], verifier=reward, workers=1) == []  # the check runs; no worker needed


def test_verl_reward_kwargs_are_accepted():
    assert compute_score("gsm8k", "\\boxed{4}", "4", None, format_score=0.1) == 1.0
    assert compute_score("gsm8k", "\\boxed{5}", "4", format_score=0.1) == 0.0


# SmolLM2-Instruct's chat prompt; OpenRLHF's queries are tokenizer.batch_decode(sequences, skip_special_tokens=False)
# of left- and right-padded prompt + response + EOS rows, and this tokenizer pads with its EOS, <|im_end|>.
SMOLLM2_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
)
OPENRLHF_RESPONSES = ["\\boxed{4}", "2 + 2 = 4. The answer is 4.", "Answer: 4", "4", "2+2=4\n#### 4", "The answer is 5."]


def test_openrlhf_queries_ending_in_eos_and_padding_text():
    queries = ["<|im_end|>" * 2 + SMOLLM2_PROMPT + response + "<|im_end|>" * 4 for response in OPENRLHF_RESPONSES]
    out = reward_func(queries, [SMOLLM2_PROMPT] * len(queries), ["4"] * len(queries))
    assert out["rewards"].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert out["extra_logs"]["no_answer"].tolist() == [0.0] * 6


@pytest.mark.parametrize("text, expected", [
    ("The answer is 4.<|im_end|><|im_end|>", "The answer is 4."),
    ("#### 4<|eot_id|><|end_of_text|>", "#### 4"),  # Llama 3
    ("Answer: 4</s><pad><pad>", "Answer: 4"),  # Llama 2 / Mistral / T5
    ("Answer: 4<end_of_turn>\n<eos><pad>", "Answer: 4"),  # Gemma
    ("Answer: 4<｜end▁of▁sentence｜>", "Answer: 4"),  # DeepSeek
    ("Answer: 4 \n<|endoftext|>  ", "Answer: 4"),
    ("<answer>4</answer>", "<answer>4</answer>"),  # markup that is not a special token stays
    ("x <|not a token|>", "x <|not a token|>"),
    ("<|im_end|>" * 3, ""),
])
def test_trailing_special_token_text_is_stripped(text, expected):
    assert strip_trailing_special_tokens(text) == expected


def test_stripping_a_long_padding_run_is_linear():
    start = time.perf_counter()
    assert strip_trailing_special_tokens("#### 4" + "<|endoftext|>" * 50_000) == "#### 4"
    assert time.perf_counter() - start < 1.0


def test_verl_solution_ending_in_eos_text():  # verl's naive reward manager decoded responses with their EOS before 0.4
    assert compute_score("gsm8k", "2 + 2 = 4. The answer is 4.<|im_end|>", "4") == 1.0


@pytest.mark.parametrize("ground_truth, score", [
    (np.array(["4"], dtype=object), 1.0),  # verl reads a list-valued ground_truth column as a NumPy array
    (np.array(["four", "4"], dtype=object), 1.0),
    (["4", "2^2"], 1.0),
    (("5", "6"), 0.0),
    (np.str_("4"), 1.0),
    (np.array("4"), 1.0),
])
def test_verl_ground_truth_lists_accept_any_of_their_answers(ground_truth, score):
    assert compute_score("my_math", "so \\boxed{4}", ground_truth) == score


@pytest.mark.parametrize("ground_truth", [None, [], np.array([], dtype=object), ["4", None], "", "  "])
def test_verl_unusable_ground_truth_raises_naming_it(ground_truth):
    with pytest.raises(ValueError, match=r"ground_truth .* \(data_source 'my_math'\) has no usable answer"):
        compute_score("my_math", "so \\boxed{4}", ground_truth)


def test_an_interrupted_check_never_hands_its_reply_to_the_next_one(monkeypatch):
    """A KeyboardInterrupt caught by the caller (a notebook, a trainer loop) used to leave the worker in the
    pool with the reply still coming: the next check read it, and sqrt(3) = 2 sqrt(2) scored 1.0."""
    from rewards import sandbox

    assert math_verifier("\\boxed{\\sqrt{8}}", answer="2\\sqrt{2}").score == 1.0  # a worker is up and idle
    real_select = sandbox.select.select

    def interrupted(*args):
        monkeypatch.setattr(sandbox.select, "select", real_select)
        raise KeyboardInterrupt

    monkeypatch.setattr(sandbox.select, "select", interrupted)
    with pytest.raises(KeyboardInterrupt):
        math_verifier("\\boxed{\\sqrt{8}}", answer="2\\sqrt{2}")  # a true check, interrupted in flight
    assert math_verifier("\\boxed{\\sqrt{3}}", answer="2\\sqrt{2}").score == 0.0


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0, -1])
def test_timeouts_must_be_finite_positive_seconds(timeout):
    with pytest.raises(ValueError, match="finite number of seconds > 0"):
        math_verifier("\\boxed{\\sqrt{8}}", answer="2\\sqrt{2}", timeout=timeout)
    with pytest.raises(ValueError, match="finite number of seconds > 0"):
        score_batch(["\\boxed{1}"], ["1"], timeout=timeout)


@pytest.mark.parametrize("gold, completion", [
    (3e-05, "0.00003"),  # repr "3e-05" read as 3e - 5 (Euler's e)
    (2e16, "2 \\times 10^{16}"),
    (np.float32(0.1), "0.1"),  # float() of it: 0.10000000149011612
    (np.float64(72.0), "72"),
])
def test_numeric_golds_are_read_as_their_values(gold, completion):
    assert math_verifier(f"\\boxed{{{completion}}}", answer=gold).score == 1.0


@pytest.mark.parametrize("gold, reason", [
    ("", "blank"), ("   ", "blank"), ("\\boxed{}", "holds none"), ("#### ", "holds none"),
    (float("nan"), "not a finite number"), (None, "string or a number"),
])
def test_an_unusable_gold_is_an_error_naming_it(gold, reason):
    result = math_verifier("\\boxed{3}", answer=gold)
    assert (result.score, result.status) == (0.0, "error") and reason in result.details["reason"]
