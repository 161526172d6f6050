"""DPO (algos/algorithms/dpo.py, algos/core/preference.py): the losses by hand, the pairs the verifier forms, the dataset's
errors, and end to end: the gradient of every offline step equals the DPO objective's written in plain, unchunked
torch inside this test; a killed run resumes to the same weights; online DPO from the verifier learns."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from reference_helpers import OptimizerSpy, load_weights, model_gradients
from safetensors.torch import load_file

from algos.algorithms.dpo import (
    PRESETS,
    DPOConfig,
    DPOTrainer,
    load_preference_pairs,
    offline_pair_indices,
    sequence_logprobs,
    verifier_pairs,
)
from algos.config import load_config
from algos.core.preference import PREFERENCE_LOSSES, implicit_rewards, preference_margin
from algos.rollout import ScriptedRollout
from algos.run.reporting import read_metrics
from algos.run.warm_start import IGNORE_INDEX
from algos.system.paths import latest_checkpoint
from rlvr_env.testing import ADDITION_KWARGS, biased_addition_model, build_char_tokenizer, build_tiny_model

# ---------------------------------------------------------------- the losses


def test_preference_losses_by_hand():
    h = preference_margin(torch.tensor([-3.0]), torch.tensor([-5.0]), torch.tensor([-4.0]), torch.tensor([-4.0]))
    assert h.item() == 2.0  # (-3 - -4) - (-5 - -4)
    sigmoid = PREFERENCE_LOSSES["sigmoid"]
    assert sigmoid(h, 0.5, 0.0).item() == pytest.approx(math.log(1 + math.exp(-1)))  # -log sigmoid(0.5 x 2)
    smoothed = 0.9 * math.log(1 + math.exp(-1)) + 0.1 * math.log(1 + math.exp(1))
    assert sigmoid(h, 0.5, 0.1).item() == pytest.approx(smoothed)
    assert PREFERENCE_LOSSES["ipo"](h + 1, 0.25, 0.0).item() == pytest.approx(1.0)  # (3 - 1 / (2 x 0.25))^2
    assert PREFERENCE_LOSSES["hinge"](torch.tensor([2.0, 1.0]), 0.5, 0.0).tolist() == [0.0, 0.5]
    assert implicit_rewards(torch.tensor([-3.0]), torch.tensor([-4.0]), 0.1).item() == pytest.approx(0.1)


def test_sequence_logprobs_sum_or_average_the_completion_tokens():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-4.0, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sequence_logprobs(logp, mask, mean=False).tolist() == [-3.0, -4.0]
    assert sequence_logprobs(logp, mask, mean=True).tolist() == [-1.5, -4.0]


def test_verifier_pairs_best_with_worst_or_every_gap_largest_first():
    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.0, 0.2]])
    assert verifier_pairs(scores, "best_worst", cap=4) == [(0, 1), (9, 10)]  # the all-equal prompt gives none
    assert verifier_pairs(scores, "all", cap=3) == [(0, 1), (0, 2), (3, 1), (9, 10), (9, 11), (8, 10)]


def test_offline_steps_walk_each_epoch_in_a_new_order():
    steps = [offline_pair_indices(seed=3, step=s, num_pairs=5, per_step=2) for s in range(1, 6)]
    positions = [i for step in steps for i in step]
    assert sorted(positions[:5]) == sorted(positions[5:]) == [0, 1, 2, 3, 4]
    assert positions[:5] != positions[5:]
    assert steps[2] == offline_pair_indices(seed=3, step=3, num_pairs=5, per_step=2)  # a pure function: resumes agree


# ---------------------------------------------------------------- the dataset


def write_rows(path, rows):
    path.write_text("\n".join(row if isinstance(row, str) else json.dumps(row) for row in rows) + "\n")
    return path


def test_strings_and_chat_messages_are_read(tmp_path):
    path = write_rows(tmp_path / "p.jsonl", [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
        {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}],
         "chosen": [{"role": "assistant", "content": "4"}], "rejected": "5"},
    ])
    pairs = load_preference_pairs(path)
    assert pairs[0] == ([{"role": "user", "content": "1+1="}], [{"role": "assistant", "content": "2"}],
                        [{"role": "assistant", "content": "3"}])
    assert pairs[1][0][0] == {"role": "system", "content": "be brief"}


MESSAGES_OR_STRING = 'must be a string or a non-empty list of {"role", "content"} messages, got '


@pytest.mark.parametrize("row, message", [
    ({"prompt": "1+1=", "chosen": "2"}, "p.jsonl: row 2 has no field 'rejected' (TRL's preference format: prompt, "
                                        "chosen, rejected)"),
    ({"prompt": "1+1=", "chosen": 2, "rejected": "3"}, f"p.jsonl: row 2: field 'chosen' {MESSAGES_OR_STRING}'2'"),
    ({"prompt": [], "chosen": "2", "rejected": "3"}, f"p.jsonl: row 2: field 'prompt' {MESSAGES_OR_STRING}'[]'"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": [{"role": "assistant"}]},
     f"p.jsonl: row 2: field 'rejected' {MESSAGES_OR_STRING}\"[{{'role': 'assistant'}}]\""),
    ({"prompt": "1+1=", "chosen": "2", "rejected": [{"role": 1, "content": "x"}]},
     f"p.jsonl: row 2: field 'rejected' {MESSAGES_OR_STRING}\"[{{'role': 1, 'content': 'x'}}]\""),
    ({"prompt": "1+1=", "chosen": [7] * 40, "rejected": "3"},  # the value cut at 80 characters
     f"p.jsonl: row 2: field 'chosen' {MESSAGES_OR_STRING}{str([7] * 40)[:80]!r}"),
    ({"prompt": "1+1=", "chosen": [{"role": "user", "content": "2"}], "rejected": "3"},
     "p.jsonl: row 2: field 'chosen' must start with the assistant's message, got role 'user'"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": [{"role": "system", "content": "3"}]},
     "p.jsonl: row 2: field 'rejected' must start with the assistant's message, got role 'system'"),
    ("[1, 2]", "p.jsonl:2: expected a JSON object, got list"),
    ("{not json", "p.jsonl:2: invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
])
def test_a_bad_row_is_named_with_its_field(tmp_path, row, message):
    path = write_rows(tmp_path / "p.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, row])
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path))}/{re.escape(message)}$"):
        load_preference_pairs(path)


OFFLINE = {"dpo.dataset": "p.jsonl"}


@pytest.mark.parametrize("key, accepted, refused, message, others", [
    ("dpo.beta", "1e-6", "0", "must be > 0", OFFLINE),
    ("dpo.label_smoothing", "0.49", "0.5", "must be in [0, 0.5)", OFFLINE),
    ("dpo.label_smoothing", "0", "-0.01", "must be in [0, 0.5)", OFFLINE),
    ("dpo.pairs_per_step", "1", "0", "must be >= 1", OFFLINE),
    ("dpo.max_pairs_per_prompt", "1", "0", "must be >= 1", OFFLINE),
    ("dpo.pairing", "all", "random", "must be one of ('best_worst', 'all'), got 'random'", OFFLINE),
    ("dpo.loss_type", "hinge", "kto", "must be one of ('sigmoid', 'ipo', 'hinge')", OFFLINE),
    ("rollout.group_size", "2", "1", "must be >= 2 for online DPO (a pair compares two completions of a prompt)",
     {"dpo.online": "true"}),
])
def test_each_dpo_key_accepts_its_edge_and_names_itself_past_it(key, accepted, refused, message, others):
    section, name = key.split(".")
    value = getattr(getattr(load_config(DPOConfig, overrides={**others, key: accepted}), section), name)
    assert str(value) == accepted or value == float(accepted)
    with pytest.raises(ValueError, match=rf"^config {re.escape(key)}: {re.escape(message)}$"):
        load_config(DPOConfig, overrides={**others, key: refused})


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            "config dpo.dataset: is needed offline: a JSONL of prompt/chosen/rejected rows (--dataset FILE), or use "
            "--algo online_dpo")):
        load_config(DPOConfig, overrides={})
    with pytest.raises(ValueError, match=re.escape("config dpo.dataset: is read offline only; online DPO samples its "
                                                   "pairs from env.id (unset one of dpo.dataset, dpo.online)")):
        load_config(DPOConfig, overrides={"dpo.dataset": "p.jsonl", "dpo.online": "true"})
    with pytest.raises(ValueError, match=re.escape("config dpo.label_smoothing: smooths the sigmoid loss only; "
                                                   "dpo.loss_type is 'ipo'")):
        load_config(DPOConfig, overrides={"dpo.dataset": "p.jsonl", "dpo.loss_type": "ipo", "dpo.label_smoothing": "0.1"})
    assert load_config(DPOConfig, overrides={"dpo.online": "true"}).dpo.online  # online needs no dataset
    with pytest.raises(ValueError, match=re.escape(f"config dpo.dataset = {str(tmp_path / 'none.jsonl')!r}: no such file")):
        DPOTrainer(load_config(DPOConfig, overrides={"dpo.dataset": str(tmp_path / "none.jsonl"),
                                                    "run.output_dir": str(tmp_path / "run")}))
    assert not (tmp_path / "run").exists()  # refused before any run directory


# ---------------------------------------------------------------- end to end

PAIRS = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": "9" * (1 + (a + b) % 3)}
         for a in range(3) for b in range(3)]
PAIRS.append({"prompt": [{"role": "user", "content": "4+4="}], "chosen": [{"role": "assistant", "content": "8"}],
              "rejected": "17 or so"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo")
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model", write_rows(root / "prefs.jsonl", PAIRS)


def overrides(tiny, output_dir, **extra):
    model, prefs = tiny
    return {"model.path": str(model), "model.autocast": "null", "dpo.dataset": str(prefs), "dpo.pairs_per_step": "5",
            "loss.micro_batch_size": "3", "optim.lr": "1e-2", "optim.max_grad_norm": "0", "run.output_dir": str(output_dir),
            "run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "env.use_chat_template": "false",
            "env.kwargs": json.dumps(ADDITION_KWARGS), "env.max_new_tokens": "4", "env.eval_size": "4", **extra}


def plain_sequence_logprob(model, ids: list[int], labels: list[int], mean: bool) -> torch.Tensor:
    """log pi of a row's labelled tokens from one unpadded, unchunked forward: summed, or averaged (IPO)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    mask = torch.tensor([float(label != IGNORE_INDEX) for label in labels[1:]])
    return (logp * mask).sum() / (mask.sum() if mean else 1)


def dpo_objective(policy, reference, pairs, loss_type: str, beta: float, smoothing: float) -> torch.Tensor:
    """The step's loss from the papers, pair by pair: the mean over pairs of the loss of
    h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))."""
    mean = loss_type == "ipo"
    losses = []
    for chosen, rejected in pairs:
        with torch.no_grad():
            ref_w, ref_l = (plain_sequence_logprob(reference, *row, mean) for row in (chosen, rejected))
        h = (plain_sequence_logprob(policy, *chosen, mean) - ref_w) - (plain_sequence_logprob(policy, *rejected, mean) - ref_l)
        if loss_type == "sigmoid":
            losses.append(-(1 - smoothing) * F.logsigmoid(beta * h) - smoothing * F.logsigmoid(-beta * h))
        elif loss_type == "ipo":
            losses.append((h - 1 / (2 * beta)) ** 2)
        else:
            losses.append(torch.relu(1 - beta * h))
    return torch.stack(losses).mean()


def pair_statistics(policy, reference, pairs, mean: bool, beta: float) -> dict[str, float]:
    """TRL's metrics of ``pairs`` by hand: the implicit rewards' means, their margin, how often the chosen one's is
    higher, the sequence log-probs' means."""
    with torch.no_grad():
        rows = [[plain_sequence_logprob(model, *row, mean) for row in pair] for pair in pairs for model in (policy, reference)]
    chosen = [beta * (rows[2 * k][0] - rows[2 * k + 1][0]).item() for k in range(len(pairs))]
    rejected = [beta * (rows[2 * k][1] - rows[2 * k + 1][1]).item() for k in range(len(pairs))]
    return {"rewards/chosen": sum(chosen) / len(pairs), "rewards/rejected": sum(rejected) / len(pairs),
            "rewards/margins": (sum(chosen) - sum(rejected)) / len(pairs),
            "rewards/accuracies": sum(c > r for c, r in zip(chosen, rejected)) / len(pairs),
            "logps/chosen": sum(rows[2 * k][0].item() for k in range(len(pairs))) / len(pairs),
            "logps/rejected": sum(rows[2 * k][1].item() for k in range(len(pairs))) / len(pairs)}


# micro-batches of 2 rows (one pair) or of 4 (two pairs, the last pass one) over the step's 5 pairs
@pytest.mark.parametrize("loss_type, beta, smoothing, micro", [("sigmoid", 0.5, 0.0, "3"), ("sigmoid", 0.5, 0.2, "5"),
                                                               ("ipo", 0.25, 0.0, "5"), ("hinge", 2.0, 0.0, "4")])
def test_each_offline_step_applies_the_gradient_of_the_dpo_objective(tiny, tmp_path, loss_type, beta, smoothing, micro):
    config = load_config(DPOConfig, overrides=overrides(tiny, tmp_path, **{
        "dpo.loss_type": loss_type, "dpo.beta": str(beta), "dpo.label_smoothing": str(smoothing), "run.steps": "3",
        "loss.micro_batch_size": micro}))
    trainer = DPOTrainer(config)
    initial = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    reference = copy_of_initial = load_weights(trainer.model, initial)
    spy = OptimizerSpy(trainer.optimizer, {"": trainer.model})
    trainer.train()
    logged = [row for row in read_metrics(tmp_path) if "rewards/margins" in row]
    assert len(spy.steps) == 3 and [row["step"] for row in logged] == [1, 2, 3]
    for step, (recorded, metrics) in enumerate(zip(spy.steps, logged), 1):
        policy = load_weights(copy_of_initial, recorded["weights"])
        indices = offline_pair_indices(config.run.seed, step, len(PAIRS), 5)
        pairs = [trainer._pair_rows(i) for i in indices]
        objective = dpo_objective(policy, reference, pairs, loss_type, beta, smoothing)
        objective.backward()
        want = model_gradients(policy)
        assert set(recorded["grads"]) == set(want)
        for name, grad in want.items():
            torch.testing.assert_close(recorded["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
        assert metrics["loss"] == pytest.approx(objective.item(), rel=1e-4, abs=1e-6)
        for name, value in pair_statistics(policy, reference, pairs, loss_type == "ipo", beta).items():
            assert metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    assert logged[0]["rewards/margins"] == 0.0 and logged[-1]["rewards/margins"] > 0  # from the reference, then apart


def test_a_memory_budget_sizes_the_micro_batches_in_whole_pairs_and_the_step_is_the_same(tiny, tmp_path):
    """loss.micro_batch_memory_gb, by the rule every algorithm uses (algos/learn/micro_batches.py, probed on the
    policy's log-probs): nothing fits, one pair a pass; room, loss.micro_batch_size's rows in whole pairs."""
    def train_with(name, **extra):
        trainer = DPOTrainer(load_config(DPOConfig, overrides=overrides(tiny, tmp_path / name, **{
            "run.steps": "2", "loss.micro_batch_size": "7", **extra})))
        trainer.train()
        rows = [row["micro_batch_rows"] for row in read_metrics(tmp_path / name) if "micro_batch_rows" in row]
        return rows, {name: p.detach().clone() for name, p in trainer.model.named_parameters()}

    tight, tight_weights = train_with("tight", **{"loss.micro_batch_memory_gb": "1e-9"})
    roomy, roomy_weights = train_with("roomy", **{"loss.micro_batch_memory_gb": "100"})
    assert tight == [2.0, 2.0] and roomy == [6.0, 6.0]
    for name, weight in roomy_weights.items():  # exact accumulation: the same step in passes of one pair
        torch.testing.assert_close(tight_weights[name], weight, atol=1e-6, rtol=1e-5)


def test_each_step_line_shows_the_loss_and_the_implicit_rewards(tiny, tmp_path, capsys):
    """Without a live bar (run.progress false) a step's line leads with DPO's headline: the loss, rewards/margins and
    rewards/accuracies, as logged; GRPO's keys (reward, acc, ...) follow only when logged."""
    DPOTrainer(load_config(DPOConfig, overrides=overrides(tiny, tmp_path, **{"run.steps": "2"}))).train()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("step 1/", "step 2/"))]
    logged = [row for row in read_metrics(tmp_path) if "rewards/margins" in row]
    assert len(lines) == len(logged) == 2
    for line, row in zip(lines, logged):
        assert line.startswith(f"step {row['step']}/2 | loss {row['loss']:.3g} | margin {row['rewards/margins']:.3g} | "
                               f"pref_acc {row['rewards/accuracies']:.3g} | "), line
        assert line.endswith(f" | s {row['step_time_s']:.3g}"), line


@pytest.mark.parametrize("chat", [True, False])
def test_a_pairs_rows_are_its_prompt_as_the_env_renders_it_then_each_labelled_reply(tiny, tmp_path, chat):
    """A dataset pair as rollouts hold it: the prompt rendered as env.use_chat_template says (the tokenizer's template:
    "U:4+4=\\nA:"; without it the bare text), not labelled; then the reply and EOS, labelled."""
    trainer = DPOTrainer(load_config(DPOConfig, overrides=overrides(tiny, tmp_path, **{
        "env.use_chat_template": str(chat).lower()})))
    tokenizer = trainer.tokenizer
    prompt = "U:4+4=\nA:" if chat else "4+4="
    for (ids, labels), reply in zip(trainer._pair_rows(len(PAIRS) - 1), ("8", "17 or so")):
        assert tokenizer.decode(ids) == prompt + reply + tokenizer.eos_token
        labelled = [token for token in labels if token != IGNORE_INDEX]
        assert labelled == ids[len(ids) - len(labelled):] and tokenizer.decode(labelled) == reply + tokenizer.eos_token


def test_a_killed_offline_run_resumes_to_the_same_weights(tiny, tmp_path):
    warm_up = {"optim.warmup_steps": "3"}  # the learning rate moves each step: the schedule's state must resume too
    DPOTrainer(load_config(DPOConfig, overrides=overrides(tiny, tmp_path / "full", **{"run.steps": "4", **warm_up}))).train()
    DPOTrainer(load_config(DPOConfig, overrides=overrides(tiny, tmp_path / "cut", **{"run.steps": "2", **warm_up}))).train()
    resumed = DPOTrainer(load_config(DPOConfig, overrides=overrides(tiny, tmp_path / "cut", **{"run.steps": "4", **warm_up})),
                         resume=True)
    assert resumed.start_step == 2 and not resumed._reference  # the reference's log-probs are computed again
    resumed.train()
    full, cut = (load_file(latest_checkpoint(tmp_path / name) / "model" / "model.safetensors") for name in ("full", "cut"))
    assert full.keys() == cut.keys() and all(torch.equal(full[k], cut[k]) for k in full)


def test_a_rank_without_pairs_joins_its_peers_micro_batches_with_a_zero_weight_pass(tiny, tmp_path, monkeypatch):
    """Under DDP a rank whose prompts drew no pair (batch None) still runs a forward and backward for each of its
    peers' micro-batches (tests/test_split_rollouts.py runs it on 2 learners): its loss is a zero-weight pass over one
    row of pads, on the run's device, and the step is the peers'."""
    from algos.algorithms import dpo

    trainer = DPOTrainer(load_config(DPOConfig, overrides={**overrides(tiny, tmp_path / "run"), "dpo.dataset": "null"},
                                     preset=PRESETS["online"]))
    logp = trainer._token_logprobs(None, None)
    assert logp.shape == (1, 1) and logp.device.type == "cpu" and logp.requires_grad
    monkeypatch.setattr(dpo, "sum_over_ranks", lambda *values: (3, *values[1:]))  # a peer holds 3 pairs
    monkeypatch.setattr(dpo, "padded_micro_batches", lambda slices: [None])  # and one micro-batch of them
    before = [param.detach().clone() for param in trainer.model.parameters()]
    metrics = trainer.update(None, None)
    assert metrics["skipped_update"] == 0.0 and metrics["loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))  # zero gradient: no move (lr, Adam)


def test_online_pairs_come_from_the_verifiers_ranking(tiny, tmp_path):
    """A scripted rollout: in each group of 4 one completion is right; "best_worst" pairs it with the first wrong one
    and "all" with every wrong one, at most dpo.max_pairs_per_prompt of them; a group all wrong gives no pair."""
    def script(problem, row, round_index):
        group, member = divmod(row, 4)
        right = group != 1 and member == (group % 4)
        return str(problem.answer) if right else "x"

    for pairing, cap, pairs in (("best_worst", 4, 2), ("all", 4, 6), ("all", 2, 4)):
        config = load_config(DPOConfig, overrides={**overrides(tiny, tmp_path / f"{pairing}-{cap}", **{
            "run.steps": "1", "rollout.prompts_per_step": "3", "rollout.group_size": "4", "dpo.pairing": pairing,
            "dpo.max_pairs_per_prompt": str(cap)}), "dpo.dataset": "null"}, preset=PRESETS["online"])
        trainer = DPOTrainer(config, backend=ScriptedRollout(script))
        batch, metrics = trainer.online_batch(1)
        assert metrics["dpo/pairs"] == pairs and metrics["dpo/no_pair_prompt_frac"] == pytest.approx(1 / 3)
        assert batch.input_ids.shape[0] == 2 * pairs
        chosen = trainer.tokenizer.batch_decode(batch.input_ids[0::2, batch.prompt_width:], skip_special_tokens=True)
        assert all(text != "x" for text in chosen)
        assert trainer.update(batch, None)["skipped_update"] == 0.0


def test_rlvr_train_algo_dpo_reads_the_dataset_flag(tiny, tmp_path):
    model, prefs = tiny
    args = [f"--{key}={value}" for key, value in overrides(tiny, tmp_path / "cli", **{"run.steps": "1"}).items()
            if key != "dpo.dataset"]
    done = subprocess.run([sys.executable, "-m", "rlvr_cli", "train", "--algo", "dpo", "--dataset", str(prefs), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [row["step"] for row in read_metrics(tmp_path / "cli") if "rewards/chosen" in row] == [1]
    bad = write_rows(tmp_path / "bad.jsonl", [{"prompt": "1+1=", "chosen": "2"}])
    done = subprocess.run([sys.executable, "-m", "rlvr_cli", "train", "--algo", "dpo", "--dataset", str(bad), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "row 1 has no field 'rejected'" in done.stderr


@pytest.mark.slow
def test_online_dpo_from_the_verifier_raises_held_out_accuracy(tmp_path):
    """The GRPO learning test's model, task and budget (tests/test_grpo_learning.py: 10 steps of 64 prompts x 8):
    online DPO with the task's verifier as the judge must raise held-out greedy accuracy by the same margin."""
    model = biased_addition_model(tmp_path / "sft", steps=400, seed=0)
    config = load_config(DPOConfig, preset=PRESETS["online"], overrides={
        "model.path": str(model), "model.autocast": "null", "env.kwargs": json.dumps(ADDITION_KWARGS),
        "env.max_new_tokens": "6", "env.use_chat_template": "false", "env.eval_size": "200", "optim.lr": "1e-3",
        "run.steps": "10", "run.output_dir": str(tmp_path / "run"), "run.save_every": "0", "run.progress": "false",
        "run.tensorboard": "false", "rollout.prompts_per_step": "64", "rollout.group_size": "8", "dpo.pairing": "all",
        "loss.micro_batch_size": "256"})
    summary = DPOTrainer(config).train()
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    print(f"online dpo: held-out accuracy {before:.3f} -> {after:.3f}")
    assert before < 0.5 and after >= before + 0.2


def test_online_dpo_on_a_multiturn_task_trains_on_the_policys_own_tokens(tmp_path, monkeypatch):
    """Whole episodes from the multi-turn engine: a pair's label mask is the episode's policy mask (the env's replies
    between turns are not the policy's, so no log-prob of theirs enters the loss)."""
    from test_multiturn_rollout import chatty_rollout, tiny_policy

    from algos.algorithms import dpo
    from algos.rollout.multiturn import MultiTurnHFRollout

    torch.manual_seed(0)  # the weights under which test_multiturn_rollout.py's episodes take several turns
    model, tokenizer = tiny_policy()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    task = {"digits": 2, "operators": "*", "prompt_template": "{expression}=", "max_turns": 2}
    config = load_config(DPOConfig, preset=PRESETS["online"], overrides={
        "model.path": str(tmp_path / "model"), "model.autocast": "null", "env.id": "rlvr/CalculatorArithmetic-v0",
        "env.kwargs": json.dumps(task), "env.max_new_tokens": "16", "rollout.max_episode_tokens": "40",
        "env.eval_size": "2", "run.steps": "1", "run.output_dir": str(tmp_path / "run"), "run.progress": "false",
        "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "2", "rollout.group_size": "2"})
    trainer = DPOTrainer(config)
    assert isinstance(trainer.backend, MultiTurnHFRollout)
    # episodes of a task whose env always replies (tests/test_multiturn_rollout.py), so every row holds env tokens
    torch.manual_seed(0)
    episode = chatty_rollout(trainer.model, trainer.tokenizer)
    assert (episode.response_mask - episode.policy_mask).sum() > 0
    monkeypatch.setattr(trainer.backend, "generate", lambda *args, **kwargs: episode)
    # an untrained policy's episodes all score 0: rank row 0 over row 1 and row 5 over row 4, as a verifier would
    monkeypatch.setattr(dpo, "verifier_pairs", lambda scores, pairing, cap: [(0, 1), (5, 4)])
    batch, metrics = trainer.online_batch(1)
    assert torch.equal(batch.label_mask, episode.policy_mask[[0, 1, 5, 4]].float())
    assert metrics["dpo/pairs"] == 2
    assert trainer.update(batch, None)["skipped_update"] == 0.0


def online_config(tiny, output_dir, **extra):
    return load_config(DPOConfig, preset=PRESETS["online"], overrides={**overrides(tiny, output_dir, **{
        "rollout.prompts_per_step": "3", "rollout.group_size": "4", "dpo.dataset": "null", **extra})})


def one_right_per_group(problem, row, round_index):
    """Row ``row``'s completion: group 1 all wrong, the others right at one member that moves with the round."""
    group, member = divmod(row, 4)
    return str(problem.answer) if group != 1 and member == (group + round_index) % 4 else "x"


def test_online_pairs_drawn_a_step_ahead_train_as_the_synchronous_run_when_the_samples_do_not_depend_on_the_weights(
        tiny, tmp_path):
    """rollout.max_staleness 1: each step's pairs are drawn on the actor's thread, and the loss (the policy's and the
    reference's log-probs) is computed at training time; scripted samples do not depend on the weights, so the run
    ends on the synchronous run's weights bitwise. Steps after the first train on batches one step stale."""
    for staleness in ("0", "1"):
        config = online_config(tiny, tmp_path / staleness, **{"run.steps": "3", "run.save_every": "0",
                                                               "rollout.max_staleness": staleness})
        DPOTrainer(config, backend=ScriptedRollout(one_right_per_group)).train()
    weights = {k: load_file(latest_checkpoint(tmp_path / k) / "model" / "model.safetensors") for k in ("0", "1")}
    assert all(torch.equal(weights["0"][name], value) for name, value in weights["1"].items())
    assert [r["async/staleness"] for r in read_metrics(tmp_path / "1") if "async/staleness" in r] == [0, 1, 1]


def test_each_online_step_applies_the_gradient_against_the_initial_policy(tiny, tmp_path):
    """Two online steps from scripted samples: each step's gradient is the DPO objective's over the pairs the
    verifier's scores form, with the initial policy as the reference (at step 2 the policy has moved from it)."""
    config = online_config(tiny, tmp_path, **{"run.steps": "2", "dpo.pairing": "all", "dpo.max_pairs_per_prompt": "2",
                                              "loss.micro_batch_size": "4", "dpo.beta": "0.5"})
    backend = ScriptedRollout(one_right_per_group)
    trainer = DPOTrainer(config, backend=backend)
    initial = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    reference = load_weights(trainer.model, initial)
    spy = OptimizerSpy(trainer.optimizer, {"": trainer.model})
    trainer.train()
    sampled = [rollout for rollout in backend.rounds if rollout.response_ids.shape[0] == 12]  # not the evaluations'
    assert len(spy.steps) == len(sampled) == 2
    for recorded, rollout in zip(spy.steps, sampled):
        policy = load_weights(reference, recorded["weights"])
        rows = []
        for prompt, prompt_mask, response, response_mask in zip(rollout.prompt_ids, rollout.prompt_mask,
                                                                rollout.response_ids, rollout.response_mask):
            prompt_tokens, response_tokens = prompt[prompt_mask.bool()].tolist(), response[response_mask.bool()].tolist()
            rows.append((prompt_tokens + response_tokens, [IGNORE_INDEX] * len(prompt_tokens) + response_tokens))
        pairs = [(rows[w], rows[lo]) for w, lo in verifier_pairs(rollout.scores.view(-1, 4), "all", 2)]
        assert len(pairs) == 4  # two prompts with one right answer each, two pairs each; the all-wrong prompt none
        dpo_objective(policy, reference, pairs, "sigmoid", 0.5, 0.0).backward()
        for name, grad in model_gradients(policy).items():
            torch.testing.assert_close(recorded["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_an_online_step_without_a_pair_is_skipped_and_said(tiny, tmp_path):
    trainer = DPOTrainer(online_config(tiny, tmp_path, **{"run.steps": "1"}), backend=ScriptedRollout(lambda *_: "x"))
    said = []
    logger = type("Lines", (), {"write": lambda self, line: said.append(line)})()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    metrics = trainer.train_step(1, logger)
    assert metrics["skipped_update"] == 1.0 and metrics["dpo/pairs"] == 0 and metrics["dpo/no_pair_prompt_frac"] == 1.0
    assert said == ["step 1: every prompt's completions scored alike: no pair, update skipped"]
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert trainer.scheduler.last_epoch == 1  # the schedule still advances, as GRPO's skipped steps do
