"""math_verifier(backend="math-verify"): Hugging Face's checker with this project's guarantees around it."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("math_verify")

from rewards import MathVerifier, math_equal, math_verifier, score_batch  # noqa: E402
from rewards.adapters import compute_score, make_trl_reward  # noqa: E402
from rlvr_cli import main  # noqa: E402

CASES = [  # (completion, gold, equal)
    ("so the answer is $\\boxed{\\frac{1}{2}}$", "0.5", True),
    ("$\\boxed{(x+1)^2}$", "x^2+2x+1", True),
    ("$\\boxed{3}$", "7", False),
    ("we get \\boxed{\\sqrt{2}}", "\\sqrt{2}", True),
]


@pytest.mark.parametrize("completion, gold, equal", CASES)
def test_both_backends_agree_on_clear_cases(completion, gold, equal):
    result = math_verifier(completion, answer=gold, backend="math-verify")
    assert (result.score == 1.0, result.status, result.details["method"]) == (equal, "ok", "math-verify")
    assert math_equal(completion, gold) == equal


def test_every_result_has_a_status_and_the_limit_holds_from_any_thread():
    rambling = "I am not sure what the answer is; let me think about the problem some more before I answer it."
    assert math_verifier(rambling, answer="7", backend="math-verify").status == "no_answer"
    assert math_verifier("\\boxed{7}", answer="  ", backend="math-verify").status == "error"  # a blank gold
    math_verifier("\\boxed{1}", answer="1", backend="math-verify")  # the worker is up: only the check is timed
    assert math_verifier("\\boxed{7}", answer="7", backend="math-verify", timeout=1e-6).status == "timeout"
    with ThreadPoolExecutor(4) as pool:  # math-verify's own limit is signal-based: main thread only; ours is not
        results = list(pool.map(lambda case: math_verifier(case[0], answer=case[1], backend="math-verify"), CASES * 2))
    assert [r.score == 1.0 for r in results] == [equal for _, _, equal in CASES * 2]
    with pytest.raises(ValueError, match="backend must be one of"):
        math_verifier("\\boxed{7}", answer="7", backend="sympy")


def test_the_model_s_text_is_never_evaluated(tmp_path):
    marker = tmp_path / "evaluated"
    payload = f"__import__('os').system('touch {marker}')"
    for completion in (payload, f"The answer is {payload}", f"$\\boxed{{{payload}}}$"):
        assert math_verifier(completion, answer="0", backend="math-verify").score == 0.0
    assert not marker.exists()


def test_through_score_batch_the_adapters_and_the_cli(capsys):
    verifier = MathVerifier(backend="math-verify")
    completions, golds = [c for c, _, _ in CASES], [g for _, g, _ in CASES]
    assert [r.score for r in score_batch(completions, golds, verifier=verifier, workers=2)] == [1.0, 1.0, 0.0, 1.0]
    reward = make_trl_reward(verifier, answer_column="solution")
    assert reward(prompts=["q"], completions=[[{"role": "assistant", "content": CASES[0][0]}]], solution=["0.5"]) == [1.0]
    assert compute_score("math", CASES[1][0], "x^2+2x+1", backend="math-verify") == 1.0
    assert main(["verify", "--pred", "\\boxed{0.5}", "--gold", "\\frac{1}{2}", "--backend", "math-verify"]) == 0
    assert json.loads(capsys.readouterr().out)["details"]["method"] == "math-verify"
