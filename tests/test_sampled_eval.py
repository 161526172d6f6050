"""`rlvr eval --samples N`: the unbiased pass@k (against counting every k-subset), maj@N (ties to the answer given
first), and an evaluation whose sampled tokens do not depend on how its rows are batched."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from algos.config import EvalConfig, load_config
from algos.core.sampled_accuracy import majority_solved, pass_at_k
from algos.rollout import HFRollout
from algos.rollout.scripted import ScriptedRollout
from algos.run.evaluation import answer_votes, evaluate_sampled, reported_ks
from rlvr_cli import main
from rlvr_env.testing import saved_tiny_model


@pytest.mark.parametrize("answer", ["1/0", "2^{2^{40}}", "\\frac{", "x" * 5000, "((((((((((((1))))))))))))"])
def test_an_answers_vote_key_never_raises(answer):
    from rewards.mathcheck import answer_key

    assert hash(answer_key(answer)) is not None  # a key, whatever the model wrote


def test_numbers_past_the_size_guard_keep_keys_of_their_own():
    from rewards.mathcheck import answer_key

    assert answer_key("2^{2^{40}}") != answer_key("3^{2^{40}}")  # no value under the guard: their shapes differ
    assert answer_key("2^{2^{40}}") == answer_key("2^{2^{40}}")


def test_pass_at_k_by_hand():
    solved = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    assert pass_at_k(solved, 1).tolist() == [0.25, 0.0, 1.0, 0.5]  # the share solved
    # 1 - C(3, 2) / C(4, 2) = 1/2 for one solved of four; 1 - C(2, 2) / C(4, 2) = 5/6 for two
    assert pass_at_k(solved, 2).tolist() == pytest.approx([0.5, 0.0, 1.0, 5 / 6])
    assert pass_at_k(solved, 4).tolist() == [1.0, 0.0, 1.0, 1.0]  # any solved
    for k in (0, 5):
        with pytest.raises(ValueError, match=f"1 <= k <= the 4 samples per problem, got k = {k}"):
            pass_at_k(solved, k)


def test_pass_at_k_is_the_share_of_k_subsets_holding_a_solved_sample():
    generator = torch.Generator().manual_seed(0)
    solved = torch.rand(40, 7, generator=generator) < torch.rand(40, 1, generator=generator)
    for k in range(1, 8):
        subsets = list(itertools.combinations(range(7), k))
        counted = [sum(bool(row[list(s)].any()) for s in subsets) / len(subsets) for row in solved]
        assert pass_at_k(solved, k).tolist() == pytest.approx(counted, abs=1e-12)


def test_majority_vote_by_hand():
    votes = torch.tensor([[0, 1, 1, 2], [3, 4, 3, 4], [4, 3, 4, 3], [0, 0, -1, -1], [-1, -1, -1, -1], [0, -1, -1, -1]])
    solved = torch.tensor([[1, 0, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]],
                          dtype=torch.bool)
    # 1 outvotes 0; a 2-2 tie goes to the answer given first (3, then 4); no answer never wins; one vote is a majority
    assert majority_solved(votes, solved).tolist() == [False, True, False, False, False, True]


def test_majority_vote_is_counting_the_answers_with_ties_to_the_first_given():
    generator = torch.Generator().manual_seed(1)
    for samples in range(1, 8):
        votes = torch.randint(-1, 3, (200, samples), generator=generator)
        solved = torch.rand(200, samples, generator=generator) < 0.5
        expected = []
        for row_votes, row_solved in zip(votes.tolist(), solved.tolist()):
            given = [v for v in row_votes if v >= 0]
            if not given:
                expected.append(False)
                continue
            winner = max(dict.fromkeys(given), key=given.count)  # max keeps the first of equal counts
            expected.append(row_solved[row_votes.index(winner)])
        assert majority_solved(votes, solved).tolist() == expected


def test_answers_vote_by_value_within_their_problem():
    completions = ["\\boxed{1/2}", "so \\boxed{ \\frac{1}{2} }", "\\boxed{0.5}", "", "\\boxed{7}", "\\boxed{8}",
                   "\\boxed{x + 1}", "\\boxed{1+x}", "\\boxed{x^2-1}", "\\boxed{(x-1)(x+1)}", "\\boxed{Paris}",
                   "The answer is paris."]
    # by value and in any order; a factored polynomial only the symbolic check equates; text in its normal form
    assert answer_votes(completions, 3).tolist() == [[0, 0, 0], [-1, 0, 1], [0, 0, 1], [0, 1, 1]]
    assert reported_ks(1) == [1] and reported_ks(8) == [1, 2, 4, 8] and reported_ks(6) == [1, 2, 4, 6]


def eval_config(model_dir, **overrides):
    base = {"model.path": str(model_dir), "env.kwargs": "{digits: 1}", "env.max_new_tokens": "4", "env.eval_size": "5"}
    return load_config(EvalConfig, overrides={**base, **overrides})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=16, num_layers=1, num_heads=2)


def test_scripted_samples_score_what_was_written(tiny_dir):
    """Problem p's sample s (p: its position among the 5) answers right when s < p % 4, else one wrong number when s is
    odd and nothing when it is even."""
    from algos.model.loading import load_policy

    config = eval_config(tiny_dir, **{"env.eval_batch_size": "8", "env.max_new_tokens": "16"})  # 2 problems a batch
    positions: dict[str, int] = {}

    def script(problem, row, _):
        position, sample = positions.setdefault(problem.prompt, len(positions)), row % 4
        if sample < position % 4:
            return f"\\boxed{{{problem.answer}}}"
        return f"\\boxed{{{int(problem.answer) + 1}}}" if sample % 2 else ""

    model, tokenizer = load_policy(tiny_dir, device="cpu")
    scores = evaluate_sampled(model, tokenizer, config, ScriptedRollout(script), torch.device("cpu"), samples=4)
    solved = torch.tensor([[s < p % 4 for s in range(4)] for p in range(5)])
    assert set(scores) == {"pass@1", "pass@2", "pass@4", "maj@4"} and len(positions) == 5
    for k in (1, 2, 4):
        assert scores[f"pass@{k}"] == pytest.approx(pass_at_k(solved, k).mean().item())
    # right answers against the wrong one: 0-2, 1-2, 2-1, 3-1, 0-2: the majority is right on problems 2 and 3
    assert scores["maj@4"] == pytest.approx(2 / 5)


def test_sampled_tokens_do_not_depend_on_the_batching(tiny_dir):
    from algos.model.loading import load_policy

    model, tokenizer = load_policy(tiny_dir, device="cpu")
    class Recording(HFRollout):
        def generate(self, model, env, **sampling):
            result = super().generate(model, env, **sampling)
            self.completions.extend(result.completions)
            return result

    completions = {}
    for size in ("0", "8"):
        backend = Recording()
        backend.completions = []
        scores = evaluate_sampled(model, tokenizer, eval_config(tiny_dir, **{"env.eval_batch_size": size}), backend,
                                  torch.device("cpu"), samples=4)
        completions[size] = (backend.completions, scores)
    assert len(completions["0"][0]) == 20 and completions["0"] == completions["8"]
    assert len(set(completions["0"][0])) > 4  # sampled, not greedy: the rows differ


def test_rlvr_eval_samples_prints_pass_at_k_and_majority(tiny_dir, capsys):
    assert main(["eval", "--model", str(tiny_dir), "--env.kwargs", "{digits: 1}", "--num-problems", "3",
                 "--env.max_new_tokens", "3", "--samples", "2", "--rollout.temperature", "0.7"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["samples"] == 2 and report["temperature"] == 0.7 and "accuracy" not in report
    assert {"pass@1", "pass@2", "maj@2"} <= set(report) and report["pass@1"] <= report["pass@2"]
    with pytest.raises(SystemExit):
        main(["eval", "--model", str(tiny_dir), "--samples", "0"])
    assert "argument --samples: must be >= 1, got 0" in capsys.readouterr().err


def test_rlvr_eval_output_writes_what_the_model_wrote_a_row_a_record(tiny_dir, tmp_path, capsys):
    out = tmp_path / "evals.jsonl"
    args = ["eval", "--model", str(tiny_dir), "--env.kwargs", "{digits: 1}", "--num-problems", "3", "--env.max_new_tokens",
            "3", "--env.eval_batch_size", "2"]
    assert main([*args, "--output", str(out)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    greedy = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["problem"] for r in greedy] == [0, 1, 2] and "sample" not in greedy[0]
    assert set(greedy[0]) == {"problem", "prompt", "completion", "answer", "score", "status", "components", "truncated"}
    assert report["accuracy"] == sum(r["components"]["correct"] >= 1 for r in greedy) / 3
    assert main([*args, "--output", str(out), "--samples", "2"]) == 0
    sampled = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["problem"], r["sample"]) for r in sampled] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert [r["prompt"] for r in sampled[::2]] == [r["prompt"] for r in greedy]  # the same problems, in order
    capsys.readouterr()
    assert main([*args, "--output", str(tmp_path / "no_such_dir" / "x.jsonl")]) == 2
    assert "--output " in capsys.readouterr().err


def test_sampled_evaluation_of_a_given_set_and_of_one_sample(tiny_dir):
    """An eval_set given (here 2 problems of 2-digit sums, where the config says 1-digit) is the one evaluated;
    one sample a problem reports pass@1 and maj@1; none is refused."""
    import rlvr_env
    from algos.model.loading import load_policy

    model, tokenizer = load_policy(tiny_dir, device="cpu")
    task = rlvr_env.make_task("Arithmetic", digits=2)
    records = []
    scores = evaluate_sampled(model, tokenizer, eval_config(tiny_dir), HFRollout(), torch.device("cpu"),
                              eval_set=(task, [4, 9]), records=records, samples=1)
    assert set(scores) == {"pass@1", "maj@1"}
    assert [(r["problem"], r["sample"]) for r in records] == [(0, 0), (1, 0)]
    assert all(type(r["problem"]) is int for r in records)
    assert [r["prompt"] for r in records] == [task.problem(i, 12345).prompt for i in (4, 9)]  # env.eval_seed's
    with pytest.raises(ValueError, match="samples must be >= 1, got 0"):
        evaluate_sampled(model, tokenizer, eval_config(tiny_dir), HFRollout(), torch.device("cpu"), samples=0)
