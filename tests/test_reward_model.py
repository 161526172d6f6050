import importlib.util
import json
from pathlib import Path

import pytest
import torch

from algos.model.reward import (
    PreferencePair,
    RewardModel,
    bradley_terry_loss,
    load_preference_pairs,
    preference_accuracy,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_reward_model.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_reward_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bradley_terry_loss_matches_formula():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])
    expected = -(torch.sigmoid(torch.tensor(2.0)).log() + torch.sigmoid(torch.tensor(-1.0)).log()) / 2
    torch.testing.assert_close(bradley_terry_loss(chosen, rejected), expected)
    with_margin = bradley_terry_loss(chosen, rejected, margin=torch.tensor([2.0, -1.0]))
    torch.testing.assert_close(with_margin, -torch.sigmoid(torch.tensor(0.0)).log())


def test_preference_file_errors_name_row_and_field(tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n\n"
                    + json.dumps({"prompt": "p", "chosen": 3, "rejected": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"row 3 field 'chosen' must be a string"):
        load_preference_pairs(path)
    path.write_text(json.dumps({"prompt": "p", "chosen": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"row 1 field 'rejected' is missing"):
        load_preference_pairs(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"prefs.jsonl:1: invalid JSON"):
        load_preference_pairs(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match=r"prefs.jsonl: no records"):
        load_preference_pairs(path)
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")

    table = tmp_path / "prefs.parquet"  # TRL's preference datasets ship as parquet
    parquet.write_table(pyarrow.table({"prompt": ["p"], "chosen": ["a"], "rejected": ["b"]}), table)
    assert load_preference_pairs(table) == [PreferencePair("p", "a", "b")]


def test_example_trains_a_bradley_terry_model_that_ranks_held_out_pairs(tmp_path):
    example = load_example()
    pairs = example.synthetic_format_pairs(240, seed=1)
    pairs_file = tmp_path / "prefs.jsonl"
    pairs_file.write_text("".join(json.dumps(vars(p)) + "\n" for p in pairs))
    out = tmp_path / "rm"
    summary = example.main(["--pairs", str(pairs_file), "--out", str(out), "--seed", "1"])
    assert summary["held_out_pairs"] == 48
    assert summary["held_out_accuracy_before"] < 0.8
    assert summary["held_out_accuracy_after"] >= 0.95

    reloaded = RewardModel.from_pretrained(out)
    fresh = example.synthetic_format_pairs(50, seed=99)
    assert preference_accuracy(reloaded, fresh) >= 0.95
    # Batching and padding do not change a pair's score.
    prompts, completions = ["7+5=", "1+1="], ["\\boxed{12}", "2"]
    together = reloaded.score(prompts, completions)
    alone = torch.cat([reloaded.score(prompts[i : i + 1], completions[i : i + 1]) for i in range(2)])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)


def test_reward_model_rejects_a_multi_label_head():
    example = load_example()
    reward_model = example.tiny_reward_model(seed=0)
    reward_model.model.config.num_labels = 2
    with pytest.raises(ValueError, match="num_labels=1"):
        RewardModel(reward_model.model, reward_model.tokenizer)
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        example.tiny_reward_model(seed=0).score(["a", "b"], ["c"])


def test_preference_accuracy_counts_strict_wins():
    class ConstantModel:
        def score(self, prompts, completions):
            return torch.tensor([len(c) for c in completions], dtype=torch.float32)

    pairs = [PreferencePair("p", "long", "s"), PreferencePair("p", "s", "long"), PreferencePair("p", "ab", "cd")]
    assert preference_accuracy(ConstantModel(), pairs) == pytest.approx(1 / 3)


def test_centering_term_is_trls_pair_sum_not_each_reward():
    """TRL's center_rewards_coefficient adds coef * mean((r_c + r_r)^2); coef * mean of each reward squared
    also penalised the margin (r_c - r_r)^2 / 4, against the ranking loss."""
    from algos.run.reward_model import BradleyTerryConfig, RewardModelTrainConfig, train_bradley_terry

    reward_model = load_example().tiny_reward_model(0)
    pair = PreferencePair(prompt="2+2=", chosen="\\boxed{4}", rejected="5")
    with torch.no_grad():
        chosen, rejected = reward_model.rewards([pair.prompt] * 2, [pair.chosen, pair.rejected])
    expected = bradley_terry_loss(chosen[None], rejected[None]) + 0.5 * (chosen + rejected) ** 2
    config = RewardModelTrainConfig(reward_model=BradleyTerryConfig(pairs_per_step=1, center_rewards_coef=0.5))
    history = train_bradley_terry(reward_model, [pair], config)
    assert history[0]["loss"] == pytest.approx(expected.item(), rel=1e-5)


def test_the_steps_are_the_same_in_micro_batches_of_any_size_and_bad_settings_name_their_key():
    """Bradley-Terry training runs on learn.accumulate_and_step: 5 pairs a step in passes of 1, 2 or all 5 pairs give
    the same losses and weights (the centering term included); a bad setting is named by its key."""
    from algos.config import load_config
    from algos.run.reward_model import RewardModelTrainConfig, train_bradley_terry

    pairs = [PreferencePair(f"{a}+{a}=", f"\\boxed{{{2 * a}}}", f"{2 * a}") for a in range(10)]

    def train(micro: int):
        reward_model = load_example().tiny_reward_model(0)
        config = load_config(RewardModelTrainConfig, overrides={
            "reward_model.pairs_per_step": "5", "reward_model.micro_batch_pairs": str(micro),
            "reward_model.center_rewards_coef": "0.1", "optim.lr": "1e-2",
            "optim.adam_eps": "1"})  # AdamW's first step is lr x sign(g): continuous in g only with a large eps
        history = train_bradley_terry(reward_model, pairs, config)
        return history, [p.detach().clone() for p in reward_model.model.parameters()]

    whole, whole_weights = train(5)
    assert len(whole) == 2 and whole[-1]["grad_norm"] > 0
    for micro in (1, 2):
        history, weights = train(micro)
        assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in whole], rel=1e-5)
        assert [h["accuracy"] for h in history] == [h["accuracy"] for h in whole]
        for got, want in zip(weights, whole_weights):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for key, value, message in (("reward_model.micro_batch_pairs", "0", "must be >= 1, got 0"),
                                ("reward_model.center_rewards_coef", "-1", "must be >= 0, got -1"),
                                ("optim.lr", "0", "must be > 0")):
        with pytest.raises(ValueError, match=f"config {key}: {message}"):
            load_config(RewardModelTrainConfig, overrides={key: value})


def test_each_steps_metrics_are_its_pairs_and_a_run_that_cannot_train_says_why():
    """One dict per step: the step's mean loss, and the share of its pairs whose chosen completion scores above the
    rejected one and their mean margin (a step too small to move the model: the initial model's scores); no pairs,
    or a loss that is not finite, is refused by name."""
    import random

    from algos.config import load_config
    from algos.run.reward_model import RewardModelTrainConfig, train_bradley_terry

    pairs = [PreferencePair(f"{a}+{a}=", f"\\boxed{{{2 * a}}}", f"{2 * a}") for a in range(6)]
    reward_model = load_example().tiny_reward_model(0)
    config = load_config(RewardModelTrainConfig, overrides={"reward_model.pairs_per_step": "4",
                                                            "reward_model.micro_batch_pairs": "3", "optim.lr": "1e-12"})
    order = list(range(6))
    random.Random(0).shuffle(order)
    expected = []
    for step_pairs in ([pairs[i] for i in order[:4]], [pairs[i] for i in order[4:]]):
        with torch.no_grad():
            chosen, rejected = reward_model.rewards([p.prompt for p in step_pairs] * 2,
                                                    [p.chosen for p in step_pairs] + [p.rejected for p in step_pairs]
                                                    ).split(len(step_pairs))
        expected.append({"loss": bradley_terry_loss(chosen, rejected).item(),
                         "accuracy": (chosen > rejected).float().mean().item(),
                         "margin": (chosen - rejected).mean().item()})
    history = train_bradley_terry(reward_model, pairs, config)
    assert len(history) == 2
    for got, want in zip(history, expected):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    with pytest.raises(ValueError, match="needs at least one preference pair"):
        train_bradley_terry(reward_model, [], config)
    with torch.no_grad():
        next(reward_model.model.score.parameters()).fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="Bradley-Terry loss became nan at step 1"):
        train_bradley_terry(reward_model, pairs, config)
