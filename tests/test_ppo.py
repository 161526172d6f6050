"""PPO's trainer on the tiny model: config checks, one rollout + update, critic warm-up,
reward-model rewards through `rlvr train --algo ppo`, and an exact resume after a crash."""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch

from algos.algorithms import ppo
from algos.config import load_config
from algos.learn.stats import UpdateStats
from algos.model.policy import completion_logprobs
from algos.run.reporting import read_metrics, without_wall_times
from algos.system.memory import activation_cost
from rlvr_cli import main as rlvr_main
from rlvr_env.testing import build_char_tokenizer, build_tiny_model, saved_tiny_model

TASK_KWARGS = {"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}="}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1, num_heads=2)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    """A randomly initialised tiny reward model, saved the way examples/train_reward_model.py saves one."""
    spec = importlib.util.spec_from_file_location(
        "train_reward_model", Path(__file__).resolve().parents[1] / "examples" / "train_reward_model.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    path = tmp_path_factory.mktemp("rm") / "model"
    example.tiny_reward_model(seed=0).save_pretrained(path)
    return path


def small_overrides(model_dir, output_dir, **extra):
    return {
        "model.path": str(model_dir),
        "model.autocast": "null",  # fp32 on every machine
        "env.kwargs": json.dumps(TASK_KWARGS),
        "env.max_new_tokens": "5",
        "env.use_chat_template": "false",
        "env.eval_size": "8",
        "optim.lr": "1e-3",
        "run.steps": "4",
        "run.output_dir": str(output_dir),
        "run.progress": "false",
        "run.tensorboard": "false",
        "run.plots": "false",
        "rollout.prompts_per_step": "4",
        "rollout.group_size": "2",
        "loss.micro_batch_size": "3",  # uneven micro-batches inside each minibatch
        **extra,
    }


def small_config(model_dir, output_dir, **extra):
    return load_config(ppo.PPOConfig, overrides=small_overrides(model_dir, output_dir, **extra))


def test_config_errors_name_the_key(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="ppo.reward_model"):
        small_config(tiny_model_dir, tmp_path, **{"ppo.reward_source": "model"})
    with pytest.raises(ValueError, match="ppo.reward_model.*ignored"):  # a reward model the env source would never read
        small_config(tiny_model_dir, tmp_path, **{"reward_model": "runs/rm"})
    with pytest.raises(ValueError, match="ppo.value_model"):
        small_config(tiny_model_dir, tmp_path, **{"ppo.value_model": "both"})
    with pytest.raises(ValueError, match="ppo.num_minibatches"):
        small_config(tiny_model_dir, tmp_path, **{"ppo.num_minibatches": "9"})
    with pytest.raises(ValueError, match="unknown config key 'ppo.lambda'"):
        small_config(tiny_model_dir, tmp_path, **{"ppo.lambda": "0.9"})


@pytest.mark.parametrize("value_model", ["head", "separate"])
def test_rollout_and_update_produce_finite_ppo_metrics(tiny_model_dir, reward_model_dir, tmp_path, value_model):
    # A random reward model scores every completion differently: signal even for an untrained policy.
    trainer = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path, **{"ppo.value_model": value_model},
                                          **{"ppo.reward_source": "model", "ppo.reward_model": str(reward_model_dir)}))
    assert trainer.optimizer.param_groups[1]["lr"] == pytest.approx(1e-2)  # critic lr defaults to 10x
    batch, metrics = trainer.collect(step=1)
    assert batch.num_rows == 8 and batch.returns.shape == batch.mask.shape
    assert metrics["returns_std"] > 0
    # Whitened over valid tokens, and returns were taken before whitening: R = A_raw + V.
    valid = batch.mask.bool()
    assert batch.advantages[valid].mean().abs().item() < 1e-5
    assert metrics["returns_mean"] == pytest.approx((batch.returns[valid]).mean().item(), abs=1e-5)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics.update(trainer.update(batch, train_policy=True))
    for key in ("value_loss", "value_clip_frac", "explained_variance", "returns_mean", "returns_std",
                "advantages_mean", "advantages_std", "approx_kl_k1", "approx_kl_k3", "entropy",
                "clip_frac_low", "clip_frac_high", "kl", "kl_coef", "grad_norm", "reward_mean", "accuracy"):
        assert key in metrics, key
    finite = {k: v for k, v in metrics.items() if isinstance(v, float) and k != "explained_variance"}
    assert all(torch.isfinite(torch.tensor(v)) for v in finite.values()), finite
    assert metrics["approx_kl_k3"] >= 0 and metrics["skipped_updates"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))


@pytest.mark.parametrize("value_model", ["head", "separate"])
def test_critic_warmup_leaves_the_policy_untouched(tiny_model_dir, tmp_path, value_model):
    trainer = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path, **{"ppo.value_model": value_model}))
    # Non-zero returns so the critic has something to fit.
    batch, _ = trainer.collect(step=1)
    batch.returns = torch.where(batch.mask.bool(), 1.0, 0.0)
    policy_before = [p.detach().clone() for p in trainer.policy.parameters()]
    critic_before = [p.detach().clone() for p in trainer.critic.parameters()]
    stats = trainer.update(batch, train_policy=False)
    assert stats["critic_warmup"] == 1.0 and "policy_loss" not in stats
    assert all(torch.equal(a, b) for a, b in zip(policy_before, trainer.policy.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, trainer.critic.parameters()))


def test_kill_and_resume_matches_an_uninterrupted_run(tiny_model_dir, tmp_path, monkeypatch):
    extra = {"run.save_every": "2", "run.steps": "3", "ppo.kl_target": "0.01", "ppo.value_model": "separate",
             "ppo.critic_warmup_steps": "1"}
    straight = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "straight", **extra))
    straight.train()

    class Killed(Exception):
        pass

    save = ppo.PPOTrainer.save

    def save_then_die(self, step):
        path = save(self, step)
        if step == 2:
            raise Killed  # everything after checkpoint-2 is lost, as with SIGKILL
        return path

    monkeypatch.setattr(ppo.PPOTrainer, "save", save_then_die)
    with pytest.raises(Killed):
        ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "resumed", **extra)).train()
    monkeypatch.setattr(ppo.PPOTrainer, "save", save)
    trainers = []

    class Kept(ppo.PPOTrainer):  # ppo.train's trainer, kept for its weights
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trainers.append(self)

    monkeypatch.setattr(ppo, "PPOTrainer", Kept)
    ppo.train(small_config(tiny_model_dir, tmp_path / "resumed", **extra), resume=True)  # as `rlvr train --resume` does
    (resumed,) = trainers
    assert resumed.start_step == 2

    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(straight.critic.parameters(), resumed.critic.parameters()):
        assert torch.equal(a, b)
    assert straight.kl_controller == resumed.kl_controller
    assert straight.kl_controller.coef != 0.05  # PPO-Penalty moved the coefficient
    rows = [without_wall_times(read_metrics(tmp_path / name)) for name in ("straight", "resumed")]
    assert rows[0] == rows[1]


def test_rlvr_train_ppo_with_a_learned_reward_model(tiny_model_dir, reward_model_dir, tmp_path):
    overrides = small_overrides(tiny_model_dir, tmp_path / "run", **{"run.steps": "1", "ppo.reward_source": "model",
                                                                      "ppo.reward_model": str(reward_model_dir)})
    argv = ["train", "--algo", "ppo"] + [item for key, value in overrides.items() for item in (f"--{key}", value)]
    assert rlvr_main(argv) == 0
    (record,) = [r for r in read_metrics(tmp_path / "run") if r["step"] == 1]
    assert record["reward_mean"] != 0.0  # a randomly initialised reward model still scores every completion
    assert "value_loss" in record and "explained_variance" in record


def test_half_precision_weights_warn_in_ppo_too(tiny_model_dir, tmp_path):
    """PPO builds its AdamW with a critic group of its own; it goes through build_optimizer's bf16 check too."""
    with pytest.warns(UserWarning, match="AdamW updates torch.bfloat16 weights"):
        ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path, **{"model.dtype": "bfloat16"}))


def test_critic_warmup_delays_the_policy_schedule_and_keeps_kl_coef(tiny_model_dir, tmp_path):
    """During critic warm-up the policy is frozen: its LR warm-up and decay wait for its first update (as
    verl steps the actor's scheduler only when it updates), and the adaptive KL coefficient stays put
    (KL to the reference is 0 then, which shrank kl_coef by the maximum 20% a step)."""
    from algos.config import OptimConfig
    from algos.system.runtime import advance_schedule, build_scheduler

    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.SGD([{"params": params[:1]}, {"params": params[1:]}], lr=1.0)
    scheduler = build_scheduler(optimizer, OptimConfig(lr=1.0, warmup_steps=2, schedule="linear"), 6, delays=(3, 0))
    used = [advance_schedule(scheduler) for _ in range(6)]  # each step's lr, per group
    # policy: 3 frozen steps, then warm-up 1/3, 2/3 over its own 3 steps; critic: warm-up, then linear decay over 6
    assert [round(lr, 4) for lr, _ in used] == [0.3333, 0.3333, 0.3333, 0.3333, 0.6667, 1.0]
    assert [round(lr, 4) for _, lr in used] == [0.3333, 0.6667, 1.0, 0.75, 0.5, 0.25]

    trainer = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path, **{
        "ppo.critic_warmup_steps": "1", "ppo.kl_coef": "0.05", "ppo.kl_target": "6.0"}))
    trainer.collect(step=1)
    assert trainer.kl_controller.coef == 0.05
    trainer.collect(step=2)
    assert trainer.kl_controller.coef != 0.05


def test_non_finite_values_warmup_past_the_run_and_causal_lm_reward_models_are_refused(tiny_model_dir, tmp_path):
    from transformers import LlamaConfig

    for key in ("ppo.vf_coef", "ppo.critic_lr", "ppo.kl_clamp"):
        with pytest.raises(ValueError, match=f"{key}: must be a finite number, got inf"):
            small_config(tiny_model_dir, tmp_path, **{key: "inf"}).validate()
    with pytest.raises(ValueError, match=r"ppo.critic_warmup_steps.*must be < run.steps \(4\)"):
        small_config(tiny_model_dir, tmp_path, **{"ppo.critic_warmup_steps": "4"}).validate()
    # the policy's own directory: a causal LM, whose score head would be random
    config = small_config(tiny_model_dir, tmp_path, **{"ppo.reward_source": "model", "ppo.reward_model": str(tiny_model_dir)})
    with pytest.raises(ValueError, match=re.escape(
            f"config ppo.reward_model: {str(tiny_model_dir)!r} holds ['LlamaForCausalLM'], not a trained reward model (a "
            "...ForSequenceClassification with its score head; examples/train_reward_model.py makes one)") + "$"):
        ppo.PPOTrainer(config)
    bare = tmp_path / "bare"  # a config.json that names no architecture
    LlamaConfig().save_pretrained(bare)
    config.ppo.reward_model = str(bare)
    with pytest.raises(ValueError, match=re.escape(f"config ppo.reward_model: {str(bare)!r} holds no architecture, not")):
        ppo.PPOTrainer(config)
    config.ppo.reward_model = str(tmp_path / "missing")
    with pytest.raises(ValueError, match=re.escape(f"config ppo.reward_model: {config.ppo.reward_model!r} is not a "
                                                   "local directory") + "$"):
        ppo.PPOTrainer(config)


@pytest.mark.parametrize("value_model", ["head", "separate"])
def test_a_batch_without_signal_leaves_the_policy_where_it_is(tiny_model_dir, tmp_path, value_model):
    """With a head critic the reference log-probs came from another computation than the policy's (KV cache vs
    full forward): a 5e-7 KL at equal weights was the batch's only advantage signal, and whitening plus AdamW
    made a full-size update of it (weights moved by 7e-3 at lr 1e-3 on all-zero rewards)."""
    # 3-digit sums an untrained model never writes: every reward 0; the default prompts differ in length (padding)
    three_digits = json.dumps({"digits": 3, "terms": 2, "operators": "+"})
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(tmp_path / "model")  # 2 layers: enough for the paths to round apart
    tokenizer.save_pretrained(tmp_path / "model")
    trainer = ppo.PPOTrainer(small_config(tmp_path / "model", tmp_path / "run", **{
        "ppo.value_model": value_model, "env.kwargs": three_digits, "env.max_new_tokens": "4", "loss.micro_batch_size": "8"}))
    batch, metrics = trainer.collect(step=1)
    assert metrics["reward_mean"] == 0 and metrics["kl"] == 0
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    trainer.update(batch, train_policy=True)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))


def test_the_adaptive_kl_coefficient_moves_at_most_20_percent_and_stays_positive():
    from algos.core.gae import AdaptiveKLController

    controller = AdaptiveKLController(0.05, target=1.0, horizon=1)  # 8 rows per batch >> horizon: factor 1 - 0.2 * 8
    assert controller.update(observed_kl=0.0, n_steps=8) == pytest.approx(0.04)
    assert controller.update(observed_kl=10.0, n_steps=8) == pytest.approx(0.048)
    assert AdaptiveKLController(0.05, target=1.0, horizon=10_000).update(0.0, n_steps=100) == pytest.approx(0.05 * 0.998)


def test_reward_models_are_cut_to_their_own_context_and_must_score_one_label(tiny_model_dir, tmp_path):
    from transformers import GPT2Config, GPT2ForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

    from algos.model.reward import RewardModel

    tokenizer = build_char_tokenizer()
    short = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=16, n_layer=1,
                                                     n_head=2, num_labels=1, pad_token_id=tokenizer.pad_token_id))
    reward_model = RewardModel(short, tokenizer)
    assert reward_model.max_length == 32  # GPT-2's learned positions: IndexError past them
    assert reward_model.score(["1+1="], ["2" * 100]).shape == (1,)
    from transformers import RobertaConfig, RobertaForSequenceClassification

    roberta = RobertaForSequenceClassification(RobertaConfig(  # positions numbered from padding_idx + 1
        vocab_size=len(tokenizer), max_position_embeddings=34, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=1, pad_token_id=tokenizer.pad_token_id))
    reward_model = RewardModel(roberta, tokenizer)
    assert reward_model.max_length == 34 - tokenizer.pad_token_id - 1
    assert reward_model.score(["1+1="], ["2" * 100]).shape == (1,)
    two = LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                                     num_hidden_layers=1, num_attention_heads=2, num_labels=2))
    two.save_pretrained(tmp_path / "two")
    tokenizer.save_pretrained(tmp_path / "two")
    config = small_config(tiny_model_dir, tmp_path / "run", **{"ppo.reward_source": "model",
                                                              "ppo.reward_model": str(tmp_path / "two")})
    with pytest.raises(ValueError, match=re.escape(f"config ppo.reward_model: {str(tmp_path / 'two')!r} scores 2 labels; "
                                                   "a reward model scores one") + "$"):
        ppo.PPOTrainer(config)
    assert not (tmp_path / "run").exists()  # refused before the run directory was written


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_a_bad_task_or_eval_task_is_refused_before_the_run_directory_is_touched(tiny_model_dir, tmp_path, algo):
    """PPO built its task after open_run_dir: with overwrite_output_dir a typo in env.kwargs deleted the run's
    checkpoints before the error; an env.eval_kwargs typo did so in both trainers."""
    from algos.algorithms.grpo import GRPOConfig, GRPOTrainer

    trainer_cls, config_cls = (ppo.PPOTrainer, ppo.PPOConfig) if algo == "ppo" else (GRPOTrainer, GRPOConfig)
    (tmp_path / "checkpoint-3").mkdir()
    base = small_overrides(tiny_model_dir, tmp_path, **{"run.overwrite_output_dir": "true"})
    if algo == "grpo":
        base = {k: v for k, v in base.items() if not k.startswith("ppo.")}
    for key, value in (("env.kwargs", '{"digitz": 2}'), ("env.eval_kwargs", '{"digitz": 2}')):
        with pytest.raises(ValueError, match=f"{key}"):
            trainer_cls(load_config(config_cls, overrides={**base, key: value}))
        assert (tmp_path / "checkpoint-3").is_dir() and not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize("value_model", ["head", "separate"])
def test_micro_batches_are_sized_as_grpo_s_auto_and_by_a_memory_budget(tiny_model_dir, tmp_path, value_model):
    auto = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "auto", **{"ppo.value_model": value_model,
                                                                            "loss.micro_batch_size": "auto"}))
    batch, _ = auto.collect(step=1)
    assert auto.update(batch, train_policy=True)["micro_batch_rows"] == 8  # a CPU's rows
    budget = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "budget", **{"ppo.value_model": value_model,
                                                                                "loss.micro_batch_memory_gb": "1e-9"}))
    batch, _ = budget.collect(step=1)
    stats = budget.update(batch, train_policy=True)
    assert stats["micro_batch_rows"] == 1 and stats["skipped_updates"] == 0  # a row cannot be split
    (_, cost), one_row = budget.micro_batch_sizer.probed, batch.input_ids[:1]
    # the probe ran PPO's training forward: the critic's activations are in the cost
    policy_only = activation_cost(lambda rows: completion_logprobs(budget.policy, one_row[rows], batch.attention_mask[:1][rows],
                                                                   batch.prompt_width), one_row[:, : batch.prompt_width],
                                  budget.modules.parameters())
    assert cost.fixed_bytes + cost.row_bytes > policy_only.row_bytes


def test_ppo_measures_and_corrects_the_rollout_training_mismatch_as_grpo_does(tiny_model_dir, tmp_path):
    """PPO never read the rollout's log-probs: on vLLM it got no correction and no mismatch metrics. A top-p filter
    makes the sampler's distribution narrower than the trainer's, so pi_old / pi_rollout < 1 on every token."""
    plain = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "plain"))
    _, metrics = plain.collect(step=1)
    assert plain.rollout_correction == "none" and metrics["rollout_logp_abs_diff"] < 1e-5  # hf: the trainer's own
    nucleus = {"rollout.top_p": "0.6", "loss.rollout_correction": "tis"}
    trainer = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "tis", **nucleus))
    batch, metrics = trainer.collect(step=1)
    weights = batch.rollout_weights[batch.mask.bool()]
    assert weights.shape == batch.old_logp[batch.mask.bool()].shape and bool((weights > 0).all() and (weights <= 2).all())
    assert metrics["rollout_is_weight_mean"] == pytest.approx(weights.mean().item(), rel=1e-5)
    assert metrics["rollout_logp_abs_diff"] > 0.01 and metrics["rollout_is_weight_mean"] < 1
    # the policy loss of a micro-batch is the surrogate times those weights
    weighted = trainer._micro_batch_loss(batch, torch.arange(batch.num_rows), train_policy=True,
                                         norms={"global_num_tokens": batch.mask.sum().item(), "global_num_seqs": 1,
                                                "token_budget": 4}, stats=UpdateStats(), tokens_seen=[])
    def loss_with(weights):
        batch.rollout_weights = weights
        return trainer._micro_batch_loss(batch, torch.arange(batch.num_rows), train_policy=True,
                                         norms={"global_num_tokens": batch.mask.sum().item(), "global_num_seqs": 1,
                                                "token_budget": 4}, stats=UpdateStats(), tokens_seen=[])

    plain_loss = loss_with(None)
    assert not torch.equal(weighted, plain_loss)
    # linear in the weights: the value loss is the part at weight 0, the surrogate scales with them
    uneven = torch.arange(1.0, batch.num_rows + 1)[:, None] * batch.mask  # whitened advantages: not a flat weight
    once, twice, zeroed = loss_with(uneven), loss_with(2 * uneven), loss_with(torch.zeros_like(batch.mask))
    torch.testing.assert_close(twice - once, once - zeroed)
    assert abs((once - zeroed).item()) > 1e-4
    # an engine sampling from its own copy of the weights gets the correction by default, as under GRPO
    assert ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "static", **{"rollout.backend": "static"})
                          ).rollout_correction != "none"


def test_ppos_sequence_masked_correction_counts_the_rows_with_tokens_by_hand(tiny_model_dir, tmp_path):
    """loss.rollout_correction = "seq_mask" (cap 2): a row whose log-ratio sums past log 2 weighs 0 and counts as
    masked; the masked share is over the rows that have loss tokens (an empty row is no sequence)."""
    from types import SimpleNamespace

    trainer = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path, **{"loss.rollout_correction": "seq_mask"}))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    rollout = SimpleNamespace(logprobs=torch.tensor([[-1.0, 0.0, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    metrics = {}
    weights = trainer._rollout_weights(rollout, torch.zeros(3, 3), mask, metrics)  # log-ratios: row 0 1, row 1 0.5
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.0, 0.0], [math.exp(0.5), 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert metrics == pytest.approx({"rollout_logp_abs_diff": 1.5 / 4, "rollout_kl": (math.e - 2 + math.exp(0.5) - 1.5) / 4,
                                     "rollout_is_weight_mean": math.exp(0.5) / 4, "rollout_is_truncated_frac": 0.0,
                                     "rollout_is_masked_frac": 1 / 2})


PPO_RULES = [  # (overrides, the whole error) for each rule of PPOSection.validate and PPOConfig.validate
    *[({f"ppo.{name}": "0"}, f"config ppo.{name}: must be >= 1")
      for name in ("ppo_epochs", "num_minibatches", "reward_model_batch_size", "kl_horizon")],
    ({"ppo.gamma": "0"}, "config ppo.gamma: must be in (0, 1]"),
    ({"ppo.gamma": "1.01"}, "config ppo.gamma: must be in (0, 1]"),
    ({"ppo.lam": "-0.1"}, "config ppo.lam: must be in [0, 1]"),
    ({"ppo.lam": "1.1"}, "config ppo.lam: must be in [0, 1]"),
    ({"ppo.value_model": "big"}, "config ppo.value_model: must be one of ('head', 'separate', 'none')"),
    ({"ppo.value_model": "none", "ppo.critic_warmup_steps": "1"},
     "config ppo.critic_warmup_steps: must be 0 when ppo.value_model is 'none': there is no critic to warm up"),
    ({"ppo.score_baseline": "median"}, "config ppo.score_baseline: must be 'none' or 'group_mean', got 'median'"),
    ({"ppo.value_clip": "0"}, "config ppo.value_clip: must be > 0 or null"),
    ({"ppo.vf_coef": "0"}, "config ppo.vf_coef: must be > 0"),
    ({"ppo.critic_lr": "0"}, "config ppo.critic_lr: must be > 0 or null"),
    ({"ppo.critic_warmup_steps": "-1"}, "config ppo.critic_warmup_steps: must be >= 0"),
    ({"ppo.kl_coef": "-0.1"}, "config ppo.kl_coef: must be >= 0"),
    ({"ppo.kl_clamp": "0"}, "config ppo.kl_clamp: must be > 0"),
    ({"ppo.kl_target": "0"}, "config ppo.kl_target: must be > 0 or null"),
    ({"ppo.kl_target": "0.01", "ppo.kl_coef": "0"}, "config ppo.kl_coef: must be > 0 when ppo.kl_target is set"),
    ({"ppo.reward_source": "judge"}, "config ppo.reward_source: must be one of ('env', 'model')"),
    ({"ppo.reward_source": "model"},
     "config ppo.reward_model: must name a reward model directory when ppo.reward_source is 'model'"),
    ({"ppo.reward_model": "/somewhere"}, "config ppo.reward_model: is set, but ppo.reward_source is 'env', so it would "
                                         "be ignored: set ppo.reward_source = 'model'"),
    ({"ppo.num_minibatches": "17"}, "config ppo.num_minibatches: must be <= rows per step (16)"),
    ({"ppo.score_baseline": "group_mean"}, "config rollout.group_size: must be >= 2 for ppo.score_baseline = "
                                           "'group_mean' (a prompt's mean score over its samples)"),
    ({"ppo.critic_warmup_steps": "4", "run.steps": "4"},
     "config ppo.critic_warmup_steps: must be < run.steps (4), or the policy never trains"),
    ({"loss.surrogate": "gmpo"}, "config loss.surrogate: 'gmpo' takes one advantage per row, and GAE gives one per "
                                 "token: use 'ppo-clip', 'gspo' or 'cispo'"),
]


@pytest.mark.parametrize(("overrides", "error"), PPO_RULES, ids=[error.split(":")[0][7:] for _, error in PPO_RULES])
def test_each_ppo_rule_names_its_key_and_why(overrides, error):
    """PPOConfig's defaults are 16 prompts x 1 sample; each override breaks one rule, whose error is the whole text."""
    with pytest.raises(ValueError) as raised:
        load_config(ppo.PPOConfig, overrides=overrides)
    assert str(raised.value) == error


@pytest.mark.parametrize("overrides", [
    {"ppo.gamma": "1", "ppo.lam": "0", "ppo.kl_coef": "0", "ppo.value_model": "none", "ppo.critic_warmup_steps": "0"},
    {"ppo.lam": "1", "ppo.critic_warmup_steps": "3", "run.steps": "4", "ppo.kl_target": "0.01", "ppo.kl_coef": "0.1"},
    {"ppo.score_baseline": "group_mean", "rollout.group_size": "2", "ppo.num_minibatches": "32"},
    {"ppo.reward_source": "model", "ppo.reward_model": "/somewhere", "ppo.value_clip": "null", "ppo.critic_lr": "null"},
], ids=["lower edges", "upper edges", "group baseline", "reward model"])
def test_ppo_configs_at_the_rules_edges_are_accepted(overrides):
    assert isinstance(load_config(ppo.PPOConfig, overrides=overrides), ppo.PPOConfig)


def test_ppo_minibatches_are_shuffled_by_the_batchs_own_seed(tiny_model_dir, tmp_path):
    """Two updates of one batch from the same weights end equal whatever torch's global RNG holds: the minibatch order
    comes from batch.shuffle_seed (so a resumed run reshuffles as the straight one did), and it does shuffle."""
    overrides = {"ppo.num_minibatches": "4", "ppo.ppo_epochs": "2", "optim.warmup_steps": "0"}
    first = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "a", **overrides))
    second = ppo.PPOTrainer(small_config(tiny_model_dir, tmp_path / "b", **overrides))
    batch, _ = first.collect(step=1)
    # a random tiny model scores 0 everywhere, and a fresh critic says 0: advantages of our own make the policy move
    batch.advantages = torch.randn(batch.advantages.shape, generator=torch.Generator().manual_seed(0)) * batch.mask
    before = [param.detach().clone() for param in first.policy.parameters()]
    weights = []
    for trainer, global_seed in ((first, 1), (second, 2)):
        torch.manual_seed(global_seed)
        trainer.update(batch, train_policy=True)
        weights.append([param.detach().clone() for param in trainer.policy.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights))
    assert not all(torch.equal(a, b) for a, b in zip(before, weights[0]))  # the update moved the weights
    generator = torch.Generator().manual_seed(batch.shuffle_seed)
    assert torch.randperm(batch.num_rows, generator=generator).tolist() != list(range(batch.num_rows))
