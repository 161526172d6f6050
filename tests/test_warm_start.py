"""The supervised warm start (algos/run/warm_start.py, the warm_start config section): demonstrations are rows the rollout would
hold, labelled on the policy's tokens alone; the calculator's demonstration solves its episode; the loss falls and a
tiny model learns to call the tool from it; a run logs it, anchors its KL to it and resumes without redoing it."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import yaml
from calculator_models import TASK_KWARGS, tool_tokenizer
from safetensors.torch import load_file

from algos.algorithms import grpo, ppo
from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config
from algos.rollout.multiturn import Episode
from algos.run import warm_start as sft
from algos.run.directory import WARM_START_DIR
from algos.run.evaluation import eval_rollouts, procedural_eval_indices
from algos.run.reporting import read_metrics, without_wall_times
from algos.run.warm_start import IGNORE_INDEX, demonstration_row
from algos.system.paths import latest_checkpoint
from algos.system.runtime import grad_scaler
from rlvr_env import TokenVectorEnv, make_task
from rlvr_env.multiturn_env import MultiTurnEnv
from rlvr_env.prompting import encode_prompts
from rlvr_env.testing import build_char_tokenizer, build_tiny_model
from rlvr_env.tools import ToolCall, format_tool_call, parse_tool_calls

ADDITION = {"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}=", "format_weight": 0.0}
QUIET = {"run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "model.autocast": "null"}


def saved_model(path, tokenizer, hidden_size: int = 32, num_heads: int = 2) -> str:
    # a context with room for a calculator episode
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=2, num_heads=num_heads, max_position_embeddings=1024)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def addition_config(model_dir, output_dir, config_cls=GRPOConfig, **overrides):
    """A quiet run on 1-digit sums (plain-text prompts) with a 3-step warm start on 4 demonstrations a step."""
    base = {**QUIET, "model.path": str(model_dir), "run.output_dir": str(output_dir), "env.kwargs": json.dumps(ADDITION),
            "env.max_new_tokens": "4", "env.use_chat_template": "false", "env.eval_size": "4", "optim.lr": "1e-3",
            "warm_start.steps": "3", "warm_start.lr": "3e-3", "warm_start.batch_size": "4", "loss.micro_batch_size": "3"}
    return load_config(config_cls, overrides={**base, **overrides})


# ---------------------------------------------------------------- demonstrations


def test_a_formatted_tool_call_parses_back_to_itself():
    for name, arguments in (("calculator", {"expression": "12 * 34"}), ("python", {"code": 'print("é\\n{}")'}), ("f", {})):
        assert parse_tool_calls(format_tool_call(name, arguments)) == [ToolCall(name, arguments)]


def test_the_calculator_demonstration_solves_its_episode_with_one_tool_call():
    task = make_task("rlvr/CalculatorArithmetic-v0")  # 6-digit products
    env = MultiTurnEnv(task)
    for index in range(5):
        problem = task.problem(index, 0)
        gold = task.gold_messages(problem)
        env.start(problem)
        for message in gold:
            if message["role"] == "assistant":
                messages, reward, terminated, truncated, info = env.step(message["content"])
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert [call["status"] for call in info["tool_calls"]] == ["ok"]
        assert list(messages[-len(gold) :]) == gold  # the tool's output is the env's own


def test_labels_cover_the_assistants_tokens_and_nothing_else():
    tokenizer = tool_tokenizer()
    task = make_task("rlvr/CalculatorArithmetic-v0", **TASK_KWARGS)
    problem = task.problem(3, 0)
    assert problem.metadata["expression"] == "55 * 90"
    ids, labels = demonstration_row(task, problem, tokenizer, use_chat_template=True)
    eos = [tokenizer.eos_token_id]
    segments = [  # (text, the policy's): the template writes "S:calculator" for the tools, "T:" for a tool turn
        ("S:calculator\nU:55 * 90=\nA:", False),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "55 * 90"}}</tool_call>', True),
        ("\nT:4950\nA:", False),
        ("55 * 90 = 4950, so the answer is \\boxed{4950}.", True),
    ]
    want_ids, want_labels = [], []
    for text, policy in segments:
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"] + (eos if policy else [])
        want_ids += tokens
        want_labels += tokens if policy else [IGNORE_INDEX] * len(tokens)
    assert ids == want_ids
    assert labels == want_labels


def rollout_episode(task, problem, tokenizer, chat: bool) -> tuple[list[int], list[int], bool]:
    """(ids, 1 on the policy's tokens, solved) of the demonstration's assistant messages fed token by token to the
    rollout's own Episode, as if the policy had sampled them."""
    episode = Episode(MultiTurnEnv(task, tokenizer if chat else None), tokenizer,
                      frozenset({tokenizer.eos_token_id}), max_policy_tokens=10_000, max_tokens=10_000)
    prompt = encode_prompts([episode.begin(problem)], tokenizer, chat_rendered=chat)[0]
    for message in task.gold_messages(problem):
        if message["role"] == "assistant":
            for token in [*tokenizer(message["content"], add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]:
                episode.take(token, 0.0)
    return prompt + episode.tokens, [0] * len(prompt) + episode.policy, episode.info["success"]


@pytest.mark.parametrize(("template", "chat"), [("renders tools", True), ("no tools", True), ("plain text", False)])
def test_a_demonstration_row_is_the_episode_the_rollout_would_hold(template, chat):
    """Whatever renders the conversation: a template showing the tools, one without (plain-text tool instructions in
    the system message, tool outputs as <tool_response> user turns), or none."""
    tokenizer = tool_tokenizer() if template == "renders tools" else build_char_tokenizer()
    task = make_task("rlvr/CalculatorArithmetic-v0", **TASK_KWARGS)
    for index in range(3):
        problem = task.problem(index, 0)
        ids, labels = demonstration_row(task, problem, tokenizer, use_chat_template=chat)
        episode_ids, policy, solved = rollout_episode(task, problem, tokenizer, chat)
        assert ids == episode_ids
        assert [int(label != IGNORE_INDEX) for label in labels] == policy
        assert solved


@pytest.mark.parametrize("chat", [True, False])
def test_a_single_turn_demonstration_is_the_envs_prompt_then_the_gold_completion(chat):
    """A worked example's answer in the prompt is an assistant message too: only the demonstration's own is labelled."""
    tokenizer = build_char_tokenizer()
    task = make_task("rlvr/Arithmetic-v0", few_shot=[["What is 1 + 2?", "1 + 2 = 3."]])
    env = TokenVectorEnv(task, tokenizer, num_envs=1, max_new_tokens=4, use_chat_template=chat)
    env.reset(seed=0, options={"problem_indices": [7]})
    prompt = env.prompt_ids[0][env.prompt_mask[0].bool()].tolist()
    completion = tokenizer(task.gold_completion(env.problems[0]), add_special_tokens=False)["input_ids"]
    completion.append(tokenizer.eos_token_id)
    ids, labels = demonstration_row(task, env.problems[0], tokenizer, use_chat_template=chat)
    assert ids == prompt + completion
    assert labels == [IGNORE_INDEX] * len(prompt) + completion


def test_a_demonstration_must_open_with_the_assistants_message():
    tokenizer, prompt = build_char_tokenizer(), [{"role": "user", "content": "1+2="}]
    for replies in ([], [{"role": "tool", "content": "3"}]):
        with pytest.raises(ValueError, match=re.escape(f"a demonstration starts with the assistant's message, got {replies}")):
            sft.conversation_row(prompt, replies, lambda messages: "", tokenizer, chat_rendered=False)


# ---------------------------------------------------------------- learning


def test_the_loss_falls_over_a_warm_start(tmp_path):
    config = addition_config(saved_model(tmp_path / "model", build_char_tokenizer()), tmp_path / "run",
                             **{"warm_start.steps": "20", "warm_start.batch_size": "8", "warm_start.lr": "1e-2"})
    trainer = grpo.GRPOTrainer(config)
    losses = [metrics["warm_start/loss"] for metrics in sft.warm_start(trainer.run)]
    assert len(losses) == 20
    assert losses[-1] < 0.5 * losses[0]  # measured: 4.63 -> 1.64


def test_tensorboard_draws_the_warm_start_before_rls_first_step(tmp_path):
    """The warm start's steps, all logged at run step 0, are drawn at 1 - warm_start.steps .. 0 and RL's from 1."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    config = addition_config(saved_model(tmp_path / "model", build_char_tokenizer()), tmp_path / "run",
                             **{"run.steps": "1", "run.tensorboard": "true"})
    grpo.train(config)
    events = event_accumulator.EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("warm_start/loss")] == [-2, -1, 0]
    assert [event.step for event in events.Scalars("loss")] == [1]


def test_a_warm_start_step_applies_the_gradient_of_the_token_mean_cross_entropy(tmp_path):
    """Five calculator demonstrations (labels with the tool's output as a hole) in micro-batches of 2, 2 and 1: SGD at
    lr 1 moves each weight by minus the gradient of the cross-entropy summed over every row's labelled tokens and
    divided by their count, the reference computed row by row with no padding."""
    config = load_config(GRPOConfig, overrides={
        **QUIET, "model.path": saved_model(tmp_path / "model", tool_tokenizer()), "run.output_dir": str(tmp_path / "run"),
        "env.id": "rlvr/CalculatorArithmetic-v0", "env.kwargs": json.dumps(TASK_KWARGS), "env.max_new_tokens": "128",
        "rollout.max_episode_tokens": "170", "env.eval_size": "2", "rollout.group_size": "2", "loss.micro_batch_size": "2",
        "optim.max_grad_norm": "1e9", "model.device": "cpu"})
    run = grpo.GRPOTrainer(config).run
    task = run.env.task
    candidates = [demonstration_row(task, task.problem(i, run.env.problem_seed), run.tokenizer, config.env.use_chat_template)
                  for i in range(40)]
    # The first four and the first of another length (a 3-digit product): the batch holds padding
    rows = candidates[:4] + [next(row for row in candidates if len(row[0]) != len(candidates[0][0]))]
    reference = copy.deepcopy(run.model)
    labelled = sum(label != IGNORE_INDEX for _, labels in rows for label in labels)
    summed = torch.zeros(())
    for ids, labels in rows:
        logp = torch.log_softmax(reference(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
        targets = torch.tensor(labels[1:])
        kept = targets != IGNORE_INDEX
        summed = summed - logp[kept].gather(-1, targets[kept, None]).sum()
    (summed / labelled).backward()
    before = [p.detach().clone() for p in run.model.parameters()]
    metrics = sft.supervised_step(run, torch.optim.SGD(run.model.parameters(), lr=1.0), grad_scaler(config.model, run.device),
                                  rows)
    assert metrics["warm_start/tokens"] == labelled
    assert metrics["warm_start/skipped_update"] == 0.0 and metrics["warm_start/grad_norm"] > 0
    assert metrics["warm_start/loss"] == pytest.approx(summed.item() / labelled, rel=1e-5)
    for start, after, expected in zip(before, run.model.parameters(), reference.parameters()):
        torch.testing.assert_close(start - after.detach(), expected.grad, atol=1e-6, rtol=1e-4)


def tool_call_rate(trainer) -> float:
    """The share of held-out problems on which greedy episodes call the calculator (and the call runs)."""
    run = trainer.run
    calls = [(result.tool_calls - result.tool_errors > 0).float()
             for result in eval_rollouts(run.model, run.tokenizer, run.config, trainer.backend, run.device,
                                           run.eval_set[0], procedural_eval_indices(run.config))]
    return torch.cat(calls).mean().item()


def test_a_tiny_model_warm_started_on_demonstrations_calls_the_calculator(tmp_path):
    """A random model never writes a tool call; 60 steps on 16 demonstrations each (~6 s of CPU) and it calls the
    calculator greedily on every held-out problem (copying the product out right is more than it learns here)."""
    config = load_config(GRPOConfig, overrides={
        **QUIET, "model.path": saved_model(tmp_path / "model", tool_tokenizer(), hidden_size=64, num_heads=4),
        "run.output_dir": str(tmp_path / "run"), "env.id": "rlvr/CalculatorArithmetic-v0",
        "env.kwargs": json.dumps(TASK_KWARGS), "env.max_new_tokens": "128", "rollout.max_episode_tokens": "170",
        "env.eval_size": "16", "rollout.group_size": "2", "warm_start.steps": "60", "warm_start.lr": "3e-3",
        "warm_start.batch_size": "16", "loss.micro_batch_size": "16"})
    trainer = grpo.GRPOTrainer(config)
    assert tool_call_rate(trainer) == 0.0
    for _ in sft.warm_start(trainer.run):
        pass
    assert tool_call_rate(trainer) >= 0.8


# ---------------------------------------------------------------- runs


class Killed(Exception):
    pass


def test_a_grpo_run_warm_starts_once_and_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    model_dir = saved_model(tmp_path / "model", build_char_tokenizer())
    runs = {name: addition_config(model_dir, tmp_path / name, **{"run.steps": "3", "run.save_every": "1",
                                                                 "rollout.prompts_per_step": "2", "rollout.group_size": "4"})
            for name in ("straight", "resumed")}
    straight = grpo.GRPOTrainer(runs["straight"])
    summary = straight.train()
    records = read_metrics(tmp_path / "straight")
    warm = [r for r in records if "warm_start/loss" in r]
    assert [r["warm_start/step"] for r in warm] == [1, 2, 3] and all(r["step"] == 0 for r in warm)
    assert 0 <= summary["eval_accuracy_warm_start"] <= 1
    assert any("eval_accuracy_warm_start" in r for r in records)
    # The KL reference is the warm-started policy, saved beside the checkpoints.
    saved = load_file(tmp_path / "straight" / WARM_START_DIR / "model.safetensors")
    assert (tmp_path / "straight" / WARM_START_DIR / "tokenizer_config.json").is_file()  # a whole transformers directory
    reference = straight.ref_model.state_dict()
    assert all(torch.equal(saved[key], reference[key].cpu()) for key in saved)
    initial = load_file(tmp_path / "model" / "model.safetensors")
    assert not all(torch.equal(saved[key], initial[key]) for key in saved)

    save = grpo.GRPOTrainer.save

    def save_then_die(self, step):
        path = save(self, step)
        if step == 1:
            raise Killed  # nothing after checkpoint-1 survives, as with SIGKILL
        return path

    monkeypatch.setattr(grpo.GRPOTrainer, "save", save_then_die)
    with pytest.raises(Killed):
        grpo.GRPOTrainer(runs["resumed"]).train()
    monkeypatch.setattr(grpo.GRPOTrainer, "save", save)
    monkeypatch.setattr(sft, "warm_start", lambda run: pytest.fail("a resumed run warm-started again"))
    resumed = grpo.GRPOTrainer(runs["resumed"], resume=True)
    assert resumed.start_step == 1
    resumed.train()
    for name, module in (("policy", "model"), ("reference", "ref_model")):
        want, got = getattr(straight, module).state_dict(), getattr(resumed, module).state_dict()
        assert all(torch.equal(want[key], got[key]) for key in want), name
    rows = [without_wall_times(read_metrics(tmp_path / name)) for name in runs]
    assert rows[0] == rows[1]
    # a fresh run over the first (run.overwrite_output_dir) without a warm start keeps nothing of its KL reference
    grpo.train(addition_config(model_dir, tmp_path / "straight", **{
        "warm_start.steps": "0", "run.steps": "1", "run.overwrite_output_dir": "true"}))
    assert not (tmp_path / "straight" / WARM_START_DIR).exists()


def test_ppo_warm_starts_its_policy_and_reference_and_leaves_its_critic(tmp_path):
    config = addition_config(saved_model(tmp_path / "model", build_char_tokenizer()), tmp_path / "run", ppo.PPOConfig,
                             **{"rollout.prompts_per_step": "2", "ppo.num_minibatches": "1", "ppo.value_model": "head",
                                "ppo.kl_coef": "0.05"})
    trainer = ppo.PPOTrainer(config)
    critic = {key: value.clone() for key, value in trainer.critic.state_dict().items()}
    policy = {key: value.clone() for key, value in trainer.policy.state_dict().items()}
    for _ in sft.warm_start(trainer.run):
        pass
    sft.save_warm_started(trainer.run)
    assert all(torch.equal(value, critic[key]) for key, value in trainer.critic.state_dict().items())
    assert not all(torch.equal(value, policy[key]) for key, value in trainer.policy.state_dict().items())
    reference = trainer.ref_model.state_dict()
    assert all(torch.equal(value, reference[key]) for key, value in trainer.policy.state_dict().items())


def test_a_missing_warm_start_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / WARM_START_DIR}, the policy after this run's warm "
                                                          "start and its KL reference, is missing")):
        sft.load_warm_started(build_tiny_model(build_char_tokenizer()), tmp_path)


def test_a_checkpoint_saved_before_the_warm_start_existed_resumes_without_one(tmp_path):
    config = addition_config(saved_model(tmp_path / "model", build_char_tokenizer()), tmp_path / "run",
                             **{"run.steps": "1", "warm_start.steps": "0", "rollout.group_size": "2"})
    grpo.GRPOTrainer(config).train()
    stored = latest_checkpoint(tmp_path / "run") / "config.yaml"
    saved = yaml.safe_load(stored.read_text())
    del saved["warm_start"]
    stored.write_text(yaml.safe_dump(saved))  # as an earlier version wrote it
    config.run.steps = 2
    assert grpo.GRPOTrainer(config, resume=True).start_step == 1
    config.warm_start.steps = 2
    with pytest.raises(ValueError, match=r"cannot resume .*\(warm_start.steps: 0 -> 2"):
        grpo.GRPOTrainer(config, resume=True)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(("key", "accepted", "refused", "message"), [
    ("warm_start.steps", "0", "-1", "must be >= 0 (0 = no warm start)"),
    ("warm_start.lr", "1e-9", "0", "must be > 0, got 0.0"),
    ("warm_start.batch_size", "1", "0", "must be >= 1"),
])
def test_each_warm_start_key_accepts_its_edge_and_names_itself_past_it(key, accepted, refused, message):
    load_config(GRPOConfig, overrides={key: accepted})
    with pytest.raises(ValueError, match=rf"^config {re.escape(key)}: {re.escape(message)}$"):
        load_config(GRPOConfig, overrides={key: refused})


def test_the_warm_start_is_off_by_default_and_leaves_the_bare_keys_to_the_run():
    config = load_config(ppo.PPOConfig, overrides=["--steps", "7", "--lr", "3e-5"])
    assert (config.run.steps, config.optim.lr) == (7, 3e-5)
    assert (config.warm_start.steps, config.warm_start.lr) == (0, 2e-5)
    with pytest.raises(ValueError, match=r"unknown config key 'batch_size' \(did you mean .*warm_start.batch_size"):
        load_config(GRPOConfig, overrides=["--batch_size", "4"])


def test_the_warm_start_runs_under_a_bar_of_its_own_that_shows_each_steps_loss(monkeypatch):
    """Before RL's first step the run's own bar has nothing to count: the warm start gets a phase bar of
    warm_start.steps, its loss beside it, each step's metrics logged at step 0 (TensorBoard: 1 - steps .. 0)."""
    from types import SimpleNamespace

    from algos.run import loop

    run = SimpleNamespace(config=SimpleNamespace(warm_start=SimpleNamespace(steps=2)))
    losses = [{"warm_start/loss": 1.23456}, {"warm_start/loss": 0.5}]
    saved = []
    monkeypatch.setattr(sft, "warm_start", lambda of: iter(losses) if of is run else None)
    monkeypatch.setattr(sft, "save_warm_started", saved.append)

    class Bar:
        def __init__(self, total, desc):
            self.opened, self.postfixes, self.updates, self.closed = (total, desc), [], 0, False

        def set_postfix(self, **postfix):
            self.postfixes.append(postfix)

        def update(self):
            self.updates += 1

        def close(self):
            self.closed = True

    class Logger:
        def __init__(self):
            self.bars, self.records = [], []

        def phase_bar(self, total, desc):
            self.bars.append(Bar(total, desc))
            return self.bars[-1]

        def log(self, step, metrics, tensorboard_step):
            self.records.append((step, metrics, tensorboard_step))

    logger = Logger()
    loop.warm_start_policy(run, logger)
    (bar,) = logger.bars
    assert bar.opened == (2, "warm start") and bar.updates == 2 and bar.closed
    assert bar.postfixes == [{"loss": "1.23", "refresh": False}, {"loss": "0.5", "refresh": False}]
    assert logger.records == [(0, {"warm_start/step": 1, **losses[0]}, -1), (0, {"warm_start/step": 2, **losses[1]}, 0)]
    assert saved == [run]  # then the warm-started policy is kept as the run's KL reference
