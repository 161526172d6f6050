"""Learning that transfers (issue 18): a tiny character model that answers 1-digit sums well when worked examples
precede the question and badly when asked the bare question. GRPO on few-shot prompts alone keeps its few-shot
accuracy and moves its zero-shot accuracy a little; the same run with env.schedule fading the examples out
(few_shot_keep 1 -> 0) moves it most of the way. Measured (200 held-out problems, greedy, Intel Xeon with AMX),
zero-shot accuracy: 0.035 -> 0.255 few-shot only, 0.035 -> 0.970 faded; model seeds 1-3: 0.48, 0.19, 0.26 against
0.955, 1.00, 0.935. At lr 1e-3 (the other learning tests' rate) the gap was 0.215-0.44, and both runs lost few-shot
accuracy: Adam's first steps move every weight about as far whatever its gradient, and near-unanimous groups on a
model this sure of its answers leave mostly noise to follow.
The runs log the zero-shot score as eval_accuracy_transfer (env.transfer_eval_kwargs = {few_shot: []})."""

from __future__ import annotations

import json

import pytest
from test_grpo_learning import learning_config  # the learning tests' run, on another prompt

from algos.algorithms import grpo
from algos.run.evaluation import evaluate_saved_model, transfer_eval_config
from algos.run.reporting import read_metrics
from rlvr_env import make_task
from rlvr_env.prompting import render_prompt
from rlvr_env.testing import ADDITION_KWARGS, build_char_tokenizer, build_tiny_model, supervise_and_save

# Two worked examples, prepended to the question as earlier turns: plain text joins turns with blank lines, so a
# few-shot prompt reads "1+2=\n\n3\n\n4+4=\n\n8\n\n5+3=" and a zero-shot one "5+3=".
FEW_SHOT = [["1+2=", "3"], ["4+4=", "8"]]
TASK_KWARGS = {**ADDITION_KWARGS, "few_shot": FEW_SHOT}


def few_shot_savvy_model(path, steps: int = 800, seed: int = 0, zero_shot_wrong: float = 0.65,
                         few_shot_wrong: float = 0.05):
    """Save a tiny model supervised on half few-shot, half zero-shot prompts of 1-digit sums (rendered as the env
    renders them): after examples its answers are right but for ``few_shot_wrong`` of them, on a bare question a
    ``zero_shot_wrong`` share is the sum + 1 (greedy zero-shot accuracy ~5%, right answers still sampled). The
    learning rate decays to 0 so that the model settles on those shares: at a constant rate the last steps' noise
    decided its greedy answers, few-shot 0.47-0.94 and zero-shot 0.28-0.68 across seeds and CPU kernels."""
    import torch

    tokenizer = build_char_tokenizer()
    few, bare = make_task("Arithmetic", **TASK_KWARGS), make_task("Arithmetic", **{**TASK_KWARGS, "few_shot": []})
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=seed)
    generator = torch.Generator().manual_seed(seed)

    def batch() -> list[str]:
        indices = torch.randint(0, 10**6, (32,), generator=generator).tolist()
        with_examples = (torch.rand(32, generator=generator) < 0.5).tolist()
        draws = torch.rand(32, generator=generator).tolist()
        texts = []
        for index, shown, draw in zip(indices, with_examples, draws):
            task = few if shown else bare
            problem = task.problem(index, 999)
            wrong = draw < (few_shot_wrong if shown else zero_shot_wrong)
            prompt = render_prompt(task.messages(problem), tokenizer, use_chat_template=False)
            texts.append(prompt + str(int(problem.answer) + wrong) + tokenizer.eos_token)
        return texts

    return supervise_and_save(model, tokenizer, (batch() for _ in range(steps)), path, decay_steps=steps)


@pytest.fixture(scope="module")
def savvy_model(tmp_path_factory):
    return few_shot_savvy_model(tmp_path_factory.mktemp("savvy") / "model")


def run_config(model_path, output_dir, **overrides):
    """The learning tests' run (tests/test_grpo_learning.py) on the few-shot task, without a KL term, at lr 3e-4 (see
    the module's docstring), scoring the bare question too (eval_accuracy_transfer)."""
    return learning_config(model_path, output_dir, **{
        "env.kwargs": json.dumps(TASK_KWARGS), "env.transfer_eval_kwargs": "{few_shot: []}", "run.plots": "false",
        "grpo.beta": "0", "optim.lr": "3e-4", **overrides,
    })


def test_the_tiny_model_answers_few_shot_prompts_well_and_bare_questions_badly(savvy_model):
    config = run_config(savvy_model, "unused")
    # transfer_eval_config: the examples removed, the plain-text format kept (--zero-shot would also turn the chat
    # template on, a prompt format this model never saw).
    few_shot, bare = evaluate_saved_model(config, savvy_model), evaluate_saved_model(transfer_eval_config(config), savvy_model)
    print(f"tiny model before training: few-shot {few_shot:.3f}, zero-shot {bare:.3f}")
    assert few_shot >= 0.9 and bare <= 0.2


@pytest.mark.slow
def test_fading_the_examples_moves_zero_shot_accuracy_and_few_shot_training_does_not(savvy_model, tmp_path):
    fixed = grpo.train(run_config(savvy_model, tmp_path / "few-shot"))
    faded = grpo.train(run_config(savvy_model, tmp_path / "faded",
                                  **{"env.schedule": "{few_shot_keep: {from: 1.0, to: 0.0, end_step: 6}}"}))
    for name, summary in (("few-shot only", fixed), ("faded", faded)):
        print(f"{name}: few-shot {summary['eval_accuracy_before']:.3f} -> {summary['eval_accuracy_after']:.3f}, "
              f"zero-shot {summary['eval_accuracy_transfer_before']:.3f} -> {summary['eval_accuracy_transfer_after']:.3f}")
    assert faded["eval_accuracy_transfer_before"] == fixed["eval_accuracy_transfer_before"] <= 0.4
    assert faded["eval_accuracy_transfer_after"] >= faded["eval_accuracy_transfer_before"] + 0.5
    assert faded["eval_accuracy_transfer_after"] >= fixed["eval_accuracy_transfer_after"] + 0.3  # measured 0.475-0.81
    assert fixed["eval_accuracy_after"] >= 0.9  # the prompt it trains on stays answered (measured 0.975-1.0)
    # Not asserted: the faded run's few-shot accuracy. Measured 1.0 -> 0.195 (0.225-0.785 over seeds 1-3), its last 4
    # steps being zero-shot only: fading trades the prompt it leaves for the one it moves to.
    records = read_metrics(tmp_path / "faded")
    assert [r["schedule/few_shot_keep"] for r in records[1:]] == pytest.approx([1 - s / 6 for s in range(1, 7)] + [0.0] * 4)
    assert "eval_accuracy_transfer" in records[0] and "eval_accuracy_transfer" in records[-1]
