import pickle
import re
import time

import pytest

from rewards import (
    VerifyResult,
    WeightedSum,
    error_reason,
    format_reward,
    math_verifier,
    overlong_filter_mask,
    score_batch,
    soft_overlong_penalty,
)
from rewards.adapters import MissingGoldWarning, compute_score, make_trl_reward, reward_func
from rewards.shaping import DEFAULT_FORMAT_PATTERN, MAX_FORMAT_CHARS


@pytest.mark.parametrize("length,expected", [(0, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0), (21, -1.0)])
def test_soft_overlong_penalty_is_dapo_r_len(length, expected):
    assert soft_overlong_penalty(length, max_length=20, cache_length=4) == pytest.approx(expected)


def test_soft_overlong_penalty_rejects_bad_config():
    with pytest.raises(ValueError, match="cache_length"):
        soft_overlong_penalty(5, max_length=10, cache_length=11)


def test_overlong_filter_mask_keeps_only_complete_completions():
    assert overlong_filter_mask([3, 10, 9], max_length=10) == [True, False, True]
    assert overlong_filter_mask([3, 10], max_length=10, truncated=[True, False]) == [False, True]
    with pytest.raises(ValueError, match="truncated"):
        overlong_filter_mask([3], 10, truncated=[True, False])


def test_format_reward_default_and_custom_patterns():
    reward = format_reward()
    assert reward("<think>work</think><answer>4</answer>").score == 1.0
    assert reward("<think>work</think> so \\boxed{4}.").score == 1.0
    assert reward("no thinking \\boxed{4}").score == 0.0
    assert format_reward(r"^Answer: \d+$", score=0.5)("Answer: 12").score == 0.5
    with pytest.raises(ValueError, match="pattern"):
        format_reward("(unclosed")
    assert pickle.loads(pickle.dumps(reward))("<think>a</think><answer>1</answer>").score == 1.0


@pytest.mark.parametrize("completion, well_formed", [
    ("<think>work</think><answer>4</answer>", True),
    ("  <think>a</think>\n\n<answer>4</answer>\n", True),
    ("<think>a</think>\u00a0<answer>4</answer>\u00a0", True),  # a no-break space is blank to \s
    ("<think>a</think><answer></answer>", True),
    ("<think>a</think>b</think><answer>4</answer>", True),  # <answer> may follow a later </think>
    ("<think>a</think><answer>4</answer> trailing", False),
    ("<think>a</think> so <answer>4</answer>", False),
    ("<think>a</think> so \\boxed{4}.", True),
    ("<think>a</think>\\boxed{}", True),
    ("<think>a</think>\\boxed{4", False),
    ("<think>a \\boxed{4}</think> done", False),  # the box must come after a </think>
    ("<think>a\\boxed{</think>}", False),
    ("x<think>a</think>\\boxed{4}", False),
    ("<think>never closed \\boxed{4}", False),
])
def test_default_format_check_accepts_what_its_regex_accepts(completion, well_formed):
    assert format_reward()(completion).details["matched"] is well_formed
    assert (re.match(DEFAULT_FORMAT_PATTERN, completion, re.DOTALL) is not None) is well_formed


def _filled(prefix, unit, suffix=""):
    return prefix + unit * ((MAX_FORMAT_CHARS - len(prefix) - len(suffix)) // len(unit)) + suffix


# The default regex took hours on the first (cubic), 1-10 s on the others (quadratic).
ADVERSARIAL_FORMATS = {
    "repeated </think>\\boxed{": (_filled("<think>", "</think>\\boxed{"), 0.0),
    "repeated </think> and newline": (_filled("<think>", "</think>\n"), 0.0),
    "repeated </think><answer>": (_filled("<think>", "</think><answer>"), 0.0),
    "repeated </think> then an answer": (_filled("<think>", "</think>", "<answer>4</answer>"), 1.0),
}


@pytest.mark.timeout(60, method="thread")  # the old regex never returned to let a signal stop it
@pytest.mark.parametrize("name", ADVERSARIAL_FORMATS)
def test_default_format_check_is_linear_on_adversarial_completions(name):
    completion, score = ADVERSARIAL_FORMATS[name]
    assert MAX_FORMAT_CHARS - 20 < len(completion) <= MAX_FORMAT_CHARS
    start = time.perf_counter()
    assert format_reward()(completion).score == score
    assert time.perf_counter() - start < 0.5


def test_only_the_linear_default_format_check_runs_in_process():
    assert format_reward().in_process_safe is True
    assert pickle.loads(pickle.dumps(format_reward())).in_process_safe is True
    assert format_reward(r"^Answer: \d+$").in_process_safe is False
    assert WeightedSum([("correct", math_verifier, 1.0), ("format", format_reward(), 0.2)]).in_process_safe is True
    # so a batch scores it here, correctness and format together, instead of timing out in the pool
    completion, _ = ADVERSARIAL_FORMATS["repeated </think> then an answer"]
    combined = WeightedSum([("correct", math_verifier, 1.0), ("format", format_reward(), 1.0)])
    [result] = score_batch([completion], ["4"], verifier=combined, timeout=1.0)
    assert (result.score, result.status) == (2.0, "ok")


def test_weighted_sum_keeps_each_component():
    combined = WeightedSum([("correct", math_verifier, 1.0), ("format", format_reward(), 0.2)])
    result = combined("<think>2+2</think><answer>4</answer>", answer="4")
    assert result.score == pytest.approx(1.2)
    assert result.details["components"] == {"correct": 1.0, "format": 1.0}
    missing = combined("<think>hmm</think> I am not sure and will keep thinking about the whole problem for a while.",
                       answer="4")
    assert missing.status == "no_answer" and missing.details["components"]["correct"] == 0.0
    assert "reasons" not in result.details  # only a component that could not score says why

    def broken(completion, *, answer, **info):
        return VerifyResult(0.0, "error", {"reason": "no such tool"})

    failing = WeightedSum([("correct", math_verifier, 1.0), ("tool", broken, 1.0)])("\\boxed{4}", answer="4")
    assert (failing.score, failing.status, failing.details["reasons"]) == (1.0, "error", {"tool": "no such tool"})
    assert error_reason(failing) == "no such tool" and error_reason(VerifyResult(1.0)) is None
    assert pickle.loads(pickle.dumps(combined))("\\boxed{4}", answer="4").score == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unique"):
        WeightedSum([("a", math_verifier, 1.0), ("a", math_verifier, 1.0)])


def test_score_batch_keeps_order_in_process_and_in_the_pool():
    completions = [f"so \\boxed{{{k}}}" for k in range(40)]
    answers = [str(k if k % 3 else k + 1) for k in range(40)]
    expected = [0.0 if k % 3 == 0 else 1.0 for k in range(40)]
    assert [r.score for r in score_batch(completions, answers)] == expected
    pooled = score_batch(completions, answers, workers=2,
                         verifier=WeightedSum([("correct", math_verifier, 1.0), ("format", format_reward(), 1.0)]))
    assert [r.score for r in pooled] == expected
    assert all(isinstance(r, VerifyResult) for r in pooled)
    with pytest.raises(ValueError, match="answers"):
        score_batch(["a"], [])


def test_trl_adapter_called_as_grpo_trainer_calls_it():
    reward = make_trl_reward(answer_column="solution")
    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    completions = [[{"role": "assistant", "content": "\\boxed{4}"}], [{"role": "assistant", "content": "\\boxed{5}"}]]
    # trl 1.16 GRPOTrainer._calculate_rewards: reward_func(prompts=, completions=, completion_ids=, **reward_kwargs)
    scores = reward(prompts=prompts, completions=completions, completion_ids=[[1], [2]], solution=["4", "4"],
                    level=["1", "2"], trainer_state=object(), log_extra=lambda *a: None, log_metric=lambda *a: None)
    assert scores == [1.0, 0.0]
    assert reward(prompts=["q"], completions=["\\boxed{4}"], completion_ids=[[1]], solution=["4"]) == [1.0]
    with pytest.raises(KeyError, match="solution"):
        reward(prompts=["q"], completions=["x"], completion_ids=[[1]], answer=["4"])
    # A multi-task batch: rows without a gold answer are not this reward's (TRL leaves None out of the sum).
    completions = ["\\boxed{4}", "def f(): pass", "7"]
    with pytest.warns(MissingGoldWarning, match="None or blank get None"):
        assert reward(prompts=["q"] * 3, completions=completions, solution=["4", None, "6"]) == [1.0, None, 0.0]


def test_trl_grpo_trainer_trains_a_step_on_the_adapter(tmp_path):
    """A real TRL GRPOTrainer step: the adapter gets each row's own gold from the dataset column, and TRL logs its
    scores under the adapter's name. Generation is forced to write "7", so only the 3+4 rows are right."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlvr_env.testing import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    data = Dataset.from_list([{"prompt": "3+4=", "solution": "7"}, {"prompt": "1+1=", "solution": "2"}])
    seven = tokenizer.convert_tokens_to_ids("7")
    calls = []
    adapter = make_trl_reward(answer_column="solution", name="accuracy")

    def accuracy(**kwargs):
        calls.append((kwargs["prompts"], kwargs["completions"], kwargs["solution"], adapter(**kwargs)))
        return calls[-1][-1]

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=1, max_steps=1,
        use_cpu=True, report_to="none", logging_steps=1, save_strategy="no",
        generation_kwargs={"suppress_tokens": [i for i in range(len(tokenizer)) if i != seven]},
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[accuracy], args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    (prompts, completions, solutions, scores), = calls
    assert completions == ["7"] * 4
    assert [int(p[0]) + int(p[2]) for p in prompts] == [int(s) for s in solutions]  # row-aligned golds
    assert scores == [1.0 if s == "7" else 0.0 for s in solutions] and sorted(scores) == [0.0, 0.0, 1.0, 1.0]
    assert trainer.state.log_history[0]["rewards/accuracy/mean"] == 0.5


def test_trl_names_the_reward():
    from trl.trainer.utils import get_callable_name

    assert get_callable_name(make_trl_reward(name="accuracy")) == "accuracy"


def test_verl_and_openrlhf_adapters():
    assert compute_score("lighteval/MATH", "so \\boxed{\\frac{1}{2}}", "0.5", extra_info={"index": 3}) == 1.0
    assert compute_score("openai/gsm8k", "#### 71", "72") == 0.0
    out = reward_func(["Q: 2+2? A: \\boxed{4}", "Q: 1+1? A: \\boxed{3}"], ["Q: 2+2? A: ", "Q: 1+1? A: "], ["4", "2"])
    assert out["rewards"].tolist() == [1.0, 0.0]
    assert set(out) == {"rewards", "scores", "extra_logs"}
    # A query decoded with its BOS text: the prompt's worked example is not the response's answer.
    prompt = "Example: 1+3 = \\boxed{4}. Q: 2+2? A: "
    assert reward_func(["<s>" + prompt + "no idea"], [prompt], ["4"])["rewards"].tolist() == [0.0]
    assert reward_func(["<s>" + prompt + "\\boxed{4}"], [prompt], ["4"])["rewards"].tolist() == [1.0]


@pytest.mark.parametrize("max_length,cache_length", [(0, 1), (10, 0), (-1, -1), (10, 11)])
def test_soft_overlong_penalty_names_each_bad_setting(max_length, cache_length):
    with pytest.raises(ValueError, match=rf"need 0 < cache_length <= max_length, got max_length={max_length}, "
                                         rf"cache_length={cache_length}"):
        soft_overlong_penalty(1, max_length=max_length, cache_length=cache_length)


def test_soft_overlong_penalty_edges_a_cache_as_long_as_the_budget_and_a_one_token_budget():
    assert soft_overlong_penalty(5, max_length=10, cache_length=10) == pytest.approx(-0.5)  # from 0 at length 0
    assert soft_overlong_penalty(1, max_length=1, cache_length=1) == -1.0
    with pytest.raises(ValueError, match="length must be >= 0, got -1"):
        soft_overlong_penalty(-1, max_length=10, cache_length=2)


def test_overlong_filter_mask_budget_edges():
    assert overlong_filter_mask([0, 1], max_length=1) == [True, False]
    with pytest.raises(ValueError, match="max_length must be > 0, got 0"):
        overlong_filter_mask([1], max_length=0)


def test_format_reward_of_a_non_string_or_oversized_completion_is_zero_and_ok():
    for completion in (None, 42, "<think>a</think><answer>1</answer>" + " " * MAX_FORMAT_CHARS):
        result = format_reward()(completion)
        assert (result.score, result.status, result.details) == (0.0, "ok", {"matched": False})
    well_formed = "<think>a</think><answer>1</answer>"
    assert format_reward()(well_formed + " " * (MAX_FORMAT_CHARS - len(well_formed))).score == 1.0  # at the limit


def test_weighted_sum_names_malformed_components_and_reads_plain_floats():
    with pytest.raises(ValueError, match=r"WeightedSum component 0 must be \(name, verifier, weight\), got \['a'\]"):
        WeightedSum([["a"]])
    with pytest.raises(ValueError, match=r"WeightedSum component 0 \(3\) needs a str name, a callable and a number"):
        WeightedSum([(3, math_verifier, 1.0)])
    with pytest.raises(ValueError, match=r"component 0 \('a'\) needs"):
        WeightedSum([("a", "not callable", 1.0)])
    with pytest.raises(ValueError, match="^WeightedSum needs at least one component$"):
        WeightedSum([])
    plain = WeightedSum([("half", lambda completion, *, answer, **info: 0.5 if info == {"hint": "kept"} else 0.0, 2.0)])
    result = plain("x", answer="1", hint="kept")
    assert (result.score, result.status, result.details["statuses"]) == (1.0, "ok", {"half": "ok"})
    assert not plain.in_process_safe  # a plain function is not known to be bounded


def test_a_custom_format_pattern_spans_lines_and_components_must_be_tuples():
    assert format_reward(r"<a>.*</a>")("<a>line one\nline two</a>").score == 1.0  # re.DOTALL: '.' crosses lines
    with pytest.raises(ValueError, match="must be \\(name, verifier, weight\\)"):
        WeightedSum([["a", math_verifier, 1.0]])  # a list is not a component
