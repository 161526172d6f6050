"""Multi-turn rollouts (algos/rollout/multiturn.py) and GRPO on them: the policy's tokens are masked exactly, the sampler's
log-probs are the trainer's, the cache's holes change nothing, and the loop trains and logs episodes."""

import json
import math

import pytest
import torch
from calculator_models import TASK_KWARGS, raise_eos, tool_tokenizer

from algos.algorithms import grpo
from algos.algorithms.grpo import GRPOConfig, GRPOSection, shape_rewards
from algos.config import load_config
from algos.model.policy import completion_logprobs, position_ids_from_mask
from algos.rollout import is_multiturn_task, multiturn, row_seeds
from algos.rollout.multiturn import EpisodeDriver, MultiTurnHFRollout, observation_text
from rlvr_env import TokenVectorEnv
from rlvr_env.multiturn_env import Reply
from rlvr_env.tasks.calculator_arithmetic import CalculatorArithmeticTask
from rlvr_env.testing import build_tiny_model

REPLY = "ok"


class ChattyCalculator(CalculatorArithmeticTask):
    """Answers every message without a tool call with REPLY (reward 0.25): a random model's episodes run to max_turns,
    env messages between its own."""

    def reply(self, problem, messages):
        return Reply(REPLY, 0.25)


def tiny_policy():
    tokenizer = tool_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=1024)
    return model.eval(), tokenizer


def chatty_rollout(model, tokenizer, rows=8, group_size=4, max_new_tokens=24, max_episode_tokens=60, backend=None,
                   kinds=(), **sampling):
    task = ChattyCalculator(ChattyCalculator.config_cls(**TASK_KWARGS, kinds=list(kinds)))
    env = TokenVectorEnv(task, tokenizer, num_envs=rows, max_new_tokens=max_new_tokens)
    env.reset(seed=0, options={"group_size": group_size})
    backend = backend or MultiTurnHFRollout(max_episode_tokens=max_episode_tokens)
    seeds = sampling.pop("seeds_override", None) or (None if sampling.get("greedy") else row_seeds(0, range(rows)))
    return backend.generate(model, env, seeds=seeds, **sampling)


def multiturn_trainer(tmp_path, model, tokenizer, max_turns: int, **overrides) -> grpo.GRPOTrainer:
    """A one-step GRPO trainer on rlvr/CalculatorArithmetic-v0 (2-digit products, ``max_turns``) for ``model``,
    saved under tmp_path, with groups of 2 and nothing written but the run directory; ``overrides`` on top."""
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    task_kwargs = {"digits": 2, "operators": "*", "prompt_template": "{expression}=", "max_turns": max_turns}
    base = {
        "model.path": str(tmp_path / "model"), "env.id": "rlvr/CalculatorArithmetic-v0",
        "env.kwargs": json.dumps(task_kwargs), "env.eval_size": "4", "run.steps": "1",
        "run.output_dir": str(tmp_path / "run"), "run.save_every": "0", "run.progress": "false",
        "run.tensorboard": "false", "run.plots": "false", "rollout.group_size": "2", "model.autocast": "null",
    }
    return grpo.GRPOTrainer(load_config(GRPOConfig, overrides={**base, **overrides}))


def test_the_policy_mask_covers_the_sampled_tokens_and_nothing_else():
    torch.manual_seed(0)
    model, tokenizer = tiny_policy()
    result = chatty_rollout(model, tokenizer)
    observation = tokenizer(f"\nU:{REPLY}\nA:", add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    assert (result.turns > 1).any()
    for row in range(result.response_ids.shape[0]):
        length = int(result.response_mask[row].sum())
        ids, policy = result.response_ids[row, :length].tolist(), result.policy_mask[row, :length].tolist()
        # Each message ends with EOS (or the budget); the observation, and only it, follows each ended message.
        segments, start = [], 0
        for t in range(1, length + 1):
            if t == length or policy[t] != policy[start]:
                segments.append((policy[start], ids[start:t]))
                start = t
        for kind, tokens in segments:
            if kind == 0:
                assert tokens == observation
        messages = [tokens for kind, tokens in segments if kind == 1]
        assert len(messages) == int(result.turns[row])
        assert all(tokens[-1] == eos for tokens in messages[:-1])
        # No final answer: a budget or max_turns ended the episode; the score is its return, 0.25 per reply.
        assert bool(result.truncated[row])
        assert result.scores[row] == pytest.approx(0.25 * len(messages))
    scores, loss_mask = shape_rewards(result, GRPOSection(), max_new_tokens=24)
    assert torch.equal(loss_mask, result.policy_mask)
    assert (result.logprobs[result.policy_mask == 0] == 0).all()


# Prompts of one length, and of two (2 and 3 operands): left padding the prefill's mask and positions must skip.
@pytest.mark.parametrize("kinds", [(), ({"terms": 2}, {"terms": 3})])
def test_the_samplers_logprobs_are_a_full_forwards_on_the_policy_tokens(monkeypatch, kinds):
    squeezes = []
    squeeze = multiturn.squeeze_cache_holes
    monkeypatch.setattr(multiturn, "squeeze_cache_holes", lambda *a: squeezes.append(1) or squeeze(*a))
    monkeypatch.setattr(MultiTurnHFRollout, "squeeze_above", 1.0)  # squeeze whenever the cache has a hole
    torch.manual_seed(0)
    model, tokenizer = tiny_policy()
    result = chatty_rollout(model, tokenizer, rows=12, group_size=3, max_new_tokens=40, max_episode_tokens=90,
                            kinds=kinds)
    assert squeezes, "the rollout should have squeezed its cache's holes"
    assert bool((result.prompt_mask == 0).any()) == bool(kinds)
    ids = torch.cat([result.prompt_ids, result.response_ids], 1)
    mask = torch.cat([result.prompt_mask, result.response_mask], 1)
    width = result.prompt_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        full = torch.log_softmax(logits[:, width - 1 : -1].float(), -1).gather(-1, result.response_ids[..., None])[..., 0]
        trainer, _ = completion_logprobs(model, ids, mask, width, vocab_size=len(tokenizer))
    policy = result.policy_mask.bool()
    assert torch.allclose(result.logprobs[policy], full[policy], atol=1e-4)
    assert torch.allclose(trainer[policy], full[policy], atol=1e-4)


def test_greedy_episodes_do_not_depend_on_the_other_rows():
    torch.manual_seed(0)
    model, tokenizer = tiny_policy()
    together = chatty_rollout(model, tokenizer, rows=4, group_size=1, greedy=True)
    alone = chatty_rollout(model, tokenizer, rows=1, group_size=1, greedy=True)
    length = int(alone.response_mask[0].sum())
    assert together.response_ids[0, :length].tolist() == alone.response_ids[0, :length].tolist()


def test_a_template_that_rewrites_earlier_turns_is_refused():
    assert observation_text("A:", "hi", "A:hi\nT:3\nA:", "</s>") == "\nT:3\nA:"
    assert observation_text("A:", "hi", "A:hi<|im_end|>\nU:x\nA:", "<|im_end|>") == "\nU:x\nA:"
    with pytest.raises(ValueError, match="append-only"):
        observation_text("A:", " hi ", "A:hi\nT:3\nA:", "")


def test_grpo_trains_on_a_multiturn_task_and_logs_its_episodes(tmp_path):
    assert is_multiturn_task("rlvr/CalculatorArithmetic-v0") and not is_multiturn_task("rlvr/Arithmetic-v0")
    trainer = multiturn_trainer(tmp_path, *tiny_policy(), max_turns=2, **{
        "env.max_new_tokens": "16", "rollout.max_episode_tokens": "40", "rollout.prompts_per_step": "2"})
    assert isinstance(trainer.backend, MultiTurnHFRollout) and trainer.backend.max_episode_tokens == 40
    metrics = trainer.train_step(1, logger=type("Quiet", (), {"write": lambda self, line: None})())
    for key in ("turns_mean", "tool_calls_mean", "tool_errors_mean", "policy_len_mean", "loss"):
        assert key in metrics
    assert 1 <= metrics["turns_mean"] <= 2 and metrics["policy_len_mean"] <= 16


def test_vllm_and_static_play_a_multiturn_task_through_the_episode_driver(monkeypatch):
    from algos.rollout import make_rollout_backend, vllm
    from algos.rollout.static import StaticRollout

    monkeypatch.setattr(vllm, "VLLMRollout", lambda path, **kwargs: "engine")
    multiturn = {"env.id": "rlvr/CalculatorArithmetic-v0", "model.autocast": "null", "rollout.max_episode_tokens": "50"}
    driver = make_rollout_backend(load_config(GRPOConfig, overrides={**multiturn, "rollout.backend": "vllm"}))
    assert isinstance(driver, EpisodeDriver) and driver.engine == "engine" and driver.max_episode_tokens == 50
    driver = make_rollout_backend(load_config(GRPOConfig, overrides={**multiturn, "rollout.backend": "static"}))
    assert isinstance(driver, EpisodeDriver) and isinstance(driver.engine, StaticRollout)
    assert driver.max_episode_tokens == 50


class GenerateEngine:
    """An engine the driver knows nothing of: continue_rows by transformers' own greedy generate, a row at a time,
    recording each call's rows, budgets and seeds."""

    def __init__(self):
        self.calls = []

    def sync_weights(self, model):
        pass

    def continue_rows(self, model, contexts, *, max_new_tokens, stop_ids, vocab_size, seeds=None, greedy=False):
        assert greedy and model.config.vocab_size == vocab_size
        self.calls.append((len(contexts), list(max_new_tokens), seeds))
        continued = []
        for context, budget in zip(contexts, max_new_tokens):
            out = model.generate(torch.tensor([context]), attention_mask=torch.ones(1, len(context), dtype=torch.long),
                                 max_new_tokens=budget, do_sample=False, eos_token_id=stop_ids, pad_token_id=stop_ids[0],
                                 output_scores=True, return_dict_in_generate=True)
            ids = out.sequences[0, len(context):].tolist()
            continued.append((ids, [score[0].float().log_softmax(-1)[token].item() for score, token in zip(out.scores, ids)]))
        return continued


@pytest.mark.parametrize("eos_strength", [0.0, 1.0, 5.0])
def test_the_episode_driver_plays_an_engines_turns_as_the_hf_rollout_plays_its_tokens(eos_strength):
    """Greedy, the turn-by-turn driver over another engine gives the episodes MultiTurnHFRollout gives: same tokens,
    observations, policy mask, returns and turns. The tiny model's EOS, raised by ``eos_strength`` (raise_eos), sets
    how its episodes run: one message to the token budget (0), messages of a few tokens (1), or an empty message
    each turn until max_turns (5)."""
    torch.manual_seed(0)
    model, tokenizer = tiny_policy()
    env = TokenVectorEnv(ChattyCalculator(ChattyCalculator.config_cls(**TASK_KWARGS)), tokenizer, num_envs=8,
                         max_new_tokens=24)
    env.reset(seed=0, options={"group_size": 4})  # chatty_rollout's prompts
    raise_eos(model, tokenizer, env, eos_strength)
    expected = chatty_rollout(model, tokenizer, greedy=True)
    engine = GenerateEngine()
    played = chatty_rollout(model, tokenizer, greedy=True, backend=EpisodeDriver(engine, max_episode_tokens=60))
    for field in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "policy_mask", "scores", "turns",
                  "tool_calls", "tool_errors", "truncated"):
        assert torch.equal(getattr(played, field), getattr(expected, field)), field
    assert played.completions == expected.completions and played.statuses == expected.statuses
    torch.testing.assert_close(played.logprobs, expected.logprobs, atol=1e-4, rtol=1e-4)
    assert len(engine.calls) == expected.turns.max()  # one engine call per turn
    rows_per_turn = [rows for rows, _, _ in engine.calls]
    assert rows_per_turn[0] == 8 and rows_per_turn == sorted(rows_per_turn, reverse=True)
    assert engine.calls[0][1] == [24] * 8  # env.max_new_tokens within the 60 of the episode
    if eos_strength == 0.0:
        assert expected.turns.tolist() == [1] * 8 and expected.policy_mask.sum(1).tolist() == [24] * 8
    if eos_strength == 5.0:
        assert expected.turns.tolist() == [3] * 8 and expected.policy_mask.sum(1).tolist() == [3] * 8
        assert [budgets[0] for _, budgets, _ in engine.calls][1:] == sorted([b[0] for _, b, _ in engine.calls][1:],
                                                                             reverse=True)


class ShortEngine:
    """Continues every row with ``tokens`` (no stop token), recording the seeds it is given."""

    def __init__(self, tokens):
        self.tokens, self.seeds = tokens, []

    def continue_rows(self, model, contexts, *, max_new_tokens, stop_ids, vocab_size, seeds=None, **sampling):
        self.seeds.append(seeds)
        return [(self.tokens[:budget], [-1.0] * len(self.tokens[:budget])) for budget in max_new_tokens]


def test_a_turn_cut_short_by_the_engine_ends_its_episode_truncated_and_seeds_follow_the_row():
    model, tokenizer = tiny_policy()
    short = tokenizer.encode("12", add_special_tokens=False)
    engine = ShortEngine(short)
    seeds = row_seeds(0, range(8))
    played = chatty_rollout(model, tokenizer, backend=EpisodeDriver(engine), seeds_override=seeds)
    assert played.truncated.all() and len(engine.seeds) == 1
    assert played.turns.tolist() == [0] * 8  # the cut message never reached the env
    assert played.policy_mask.sum(1).tolist() == [len(short)] * 8 and (played.logprobs[:, : len(short)] == -1.0).all()
    assert engine.seeds[0] == [multiturn.position_seed(seed, 0) for seed in seeds]
    assert len(set(engine.seeds[0])) == 8 and multiturn.position_seed(seeds[0], 5) != engine.seeds[0][0]
    with pytest.raises(ValueError, match="max_episode_tokens must be >= 1"):
        EpisodeDriver(engine, max_episode_tokens=0)


def test_multiturn_length_and_entropy_metrics_count_the_policys_tokens(tmp_path):
    """completion_len_mean/max and entropy describe what the policy generated: an episode's tool outputs and env
    messages are context, as policy_len_mean already counted them."""
    model, tokenizer = tiny_policy()
    with torch.no_grad():  # sharper logits than a fresh model's near-uniform ones: entropies that differ by token
        model.get_input_embeddings().weight.mul_(4.0)
    trainer = multiturn_trainer(tmp_path, model, tokenizer, max_turns=3, **{
        "env.max_new_tokens": "24", "rollout.max_episode_tokens": "60", "rollout.prompts_per_step": "4", "grpo.beta": "0"})
    trainer.env.task = ChattyCalculator(ChattyCalculator.config_cls(**TASK_KWARGS))  # env messages between turns
    batch, stats = trainer.collect(1)
    response = batch.attention_mask[:, batch.prompt_width :]
    policy = batch.policy_mask
    assert (policy <= response).all() and policy.sum() < response.sum()  # the episodes read env messages
    assert stats["completion_len_mean"] == pytest.approx(stats["policy_len_mean"])
    assert stats["completion_len_mean"] == pytest.approx(policy.sum(-1).float().mean().item())
    assert stats["completion_len_max"] == policy.sum(-1).max().item()
    with torch.no_grad():
        _, entropy = trainer._logprobs(batch, slice(None))
    over_policy = ((entropy * policy).sum() / policy.sum()).item()
    over_response = ((entropy * response).sum() / response.sum()).item()
    assert abs(over_policy - over_response) > 1e-3  # the two differ, so the assertion below tells them apart
    assert trainer.update(batch)["entropy"] == pytest.approx(over_policy, rel=1e-4)


def test_single_turn_rows_keep_their_entropy_over_the_whole_response():
    from algos.algorithms.grpo import SampledRows, build_batch
    from algos.rollout.metrics import policy_token_mask

    response_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    single_turn = type("Result", (), {"response_mask": response_mask})()  # the env's RolloutResult: no policy_mask
    assert policy_token_mask(single_turn) is response_mask
    rows = SampledRows(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long),
                       torch.ones(2, 3, dtype=torch.long), response_mask, torch.zeros(2), response_mask,
                       torch.zeros(2, 3), torch.zeros(2, 3), None, policy_token_mask(single_turn))
    wider = SampledRows(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long),
                        torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), torch.zeros(2),
                        torch.ones(2, 4, dtype=torch.long), torch.zeros(2, 4), torch.zeros(2, 4), None,
                        torch.ones(2, 4, dtype=torch.long))
    batch = build_batch([rows, wider], GRPOSection(), 2, 0, torch.zeros(4))
    # update() counts every response token, as before: the policy mask is the response part of the attention mask
    assert torch.equal(batch.policy_mask, batch.attention_mask[:, batch.prompt_width :])


def test_the_policy_budget_counts_the_policys_tokens_not_the_observations():
    """env.max_new_tokens = 3 policy tokens: three one-token messages (EOS raised: each message ends at once), with the
    task's replies between them, which the episode's own budget bounds. Counting the replies against the policy's
    budget ended these episodes after two messages."""
    torch.manual_seed(0)
    model, tokenizer = tiny_policy()
    env = TokenVectorEnv(ChattyCalculator(ChattyCalculator.config_cls(**TASK_KWARGS)), tokenizer, num_envs=8,
                         max_new_tokens=3)
    env.reset(seed=0, options={"group_size": 4})
    raise_eos(model, tokenizer, env, 5.0)
    for backend in (MultiTurnHFRollout(max_episode_tokens=60), EpisodeDriver(GenerateEngine(), max_episode_tokens=60)):
        played = chatty_rollout(model, tokenizer, max_new_tokens=3, greedy=True, backend=backend)
        assert played.turns.tolist() == [3] * 8 and played.policy_mask.sum(1).tolist() == [3] * 8
        assert (played.response_mask.sum(1) > 3).all()  # the replies between the messages


EPISODE_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "policy_mask", "scores", "turns",
                  "tool_calls", "tool_errors", "truncated")


@pytest.mark.parametrize(("eos_strength", "kinds"), [(0.0, ()), (1.0, ({"terms": 2}, {"terms": 3})), (5.0, ())])
def test_the_static_engine_plays_the_hf_rollouts_greedy_episodes(eos_strength, kinds):
    """The GPU's engine on multi-turn tasks: EpisodeDriver over StaticRollout.continue_rows (contexts prefilled whole
    each turn, rows and widths in buckets) gives MultiTurnHFRollout's episodes, whose one KV cache runs across turns;
    a group's shared first context is prefilled once, and every decode step's rows are a power of two."""
    from algos.rollout.static import StaticRollout

    torch.manual_seed(0)
    model, tokenizer = tiny_policy()
    env = TokenVectorEnv(ChattyCalculator(ChattyCalculator.config_cls(**TASK_KWARGS, kinds=list(kinds))), tokenizer,
                         num_envs=8, max_new_tokens=24)
    env.reset(seed=0, options={"group_size": 4})
    raise_eos(model, tokenizer, env, eos_strength)
    expected = chatty_rollout(model, tokenizer, greedy=True, kinds=kinds)
    assert bool((expected.prompt_mask == 0).any()) == bool(kinds)
    rows = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        played = chatty_rollout(model, tokenizer, greedy=True, kinds=kinds,
                                backend=EpisodeDriver(StaticRollout(check_every=3), max_episode_tokens=60))
    finally:
        hook.remove()
    for field in EPISODE_FIELDS:
        assert torch.equal(getattr(played, field), getattr(expected, field)), field
    assert played.completions == expected.completions and played.statuses == expected.statuses
    torch.testing.assert_close(played.logprobs, expected.logprobs, atol=1e-4, rtol=1e-4)
    assert rows[0] == 2  # the first turn's prefill: one row per distinct prompt (8 rows, groups of 4)
    assert set(rows) <= {1, 2, 4, 8}


def test_a_static_continuation_stops_at_its_stop_token_or_budget_and_follows_its_seed():
    """Each context is continued within its own budget, up to and including its first stop token; a seeded row draws
    the same tokens alone as beside others (a row bucket and a prompt width of another size)."""
    from algos.rollout.static import StaticRollout

    torch.manual_seed(0)
    model, tokenizer = tiny_policy()
    engine = StaticRollout(check_every=2)
    contexts = [tokenizer.encode(text, add_special_tokens=False) for text in ("3*4=", "12*34=", "7=", "99*99*99=")]
    stop_ids, vocab = [tokenizer.eos_token_id], len(tokenizer)
    seeds = row_seeds(4, range(4))
    together = engine.continue_rows(model, contexts, max_new_tokens=[5, 1, 9, 40], stop_ids=stop_ids,
                                    vocab_size=vocab, seeds=seeds)
    for (tokens, logprobs), budget in zip(together, [5, 1, 9, 40]):
        assert 1 <= len(tokens) == len(logprobs) <= budget
        assert len(tokens) == budget or tokens[-1] in stop_ids
        assert not set(tokens[:-1]) & set(stop_ids) and all(lp <= 0 for lp in logprobs)
    alone = engine.continue_rows(model, contexts[3:], max_new_tokens=[40], stop_ids=stop_ids, vocab_size=vocab,
                                 seeds=seeds[3:])
    assert alone[0][0] == together[3][0]
    torch.testing.assert_close(alone[0][1], together[3][1], atol=1e-5, rtol=0)
    stopping = engine.continue_rows(model, contexts, max_new_tokens=[6] * 4, stop_ids=list(range(vocab)),
                                    vocab_size=vocab, seeds=seeds)
    assert [len(tokens) for tokens, _ in stopping] == [1] * 4  # every token stops
    for bad, match in (({"max_new_tokens": [5]}, "max_new_tokens: one per context, got 1 for 4"),
                       ({"seeds": seeds[:3]}, "seeds: one per context, got 3 for 4"),
                       ({"max_new_tokens": [5, 0, 1, 1]}, "max_new_tokens: every context needs at least 1")):
        arguments = {"max_new_tokens": [5] * 4, "seeds": seeds, **bad}
        with pytest.raises(ValueError, match=match):
            engine.continue_rows(model, contexts, stop_ids=stop_ids, vocab_size=vocab, **arguments)
    with pytest.raises(ValueError, match="contexts: every context needs at least one token"):
        engine.continue_rows(model, [[]], max_new_tokens=[5], stop_ids=stop_ids, vocab_size=vocab)


def test_grpo_trains_on_a_multiturn_task_with_the_static_engine(tmp_path):
    from algos.rollout.static import StaticRollout

    trainer = multiturn_trainer(tmp_path, *tiny_policy(), max_turns=2, **{
        "env.max_new_tokens": "16", "rollout.max_episode_tokens": "40", "rollout.prompts_per_step": "2",
        "rollout.backend": "static"})
    assert isinstance(trainer.backend, EpisodeDriver) and isinstance(trainer.backend.engine, StaticRollout)
    assert trainer.rollout_correction == "tis"  # an engine with its own weights: its samples are corrected
    metrics = trainer.train_step(1, logger=type("Quiet", (), {"write": lambda self, line: None})())
    assert 1 <= metrics["turns_mean"] <= 2 and metrics["policy_len_mean"] <= 16 and math.isfinite(metrics["loss"])
    assert metrics["rollout_logp_abs_diff"] < 1e-4  # fp32: the engine samples from the policy's own weights


def test_multiturn_episodes_are_drawn_beside_training_under_max_staleness(tmp_path):
    """rollout.max_staleness 1 on a multi-turn task: the actor plays whole episodes (tool calls included) on its copy
    of the policy, three steps train, the later two on batches one step stale."""
    trainer = multiturn_trainer(tmp_path, *tiny_policy(), max_turns=2, **{
        "env.max_new_tokens": "16", "rollout.max_episode_tokens": "40", "rollout.prompts_per_step": "2",
        "run.steps": "3", "rollout.max_staleness": "1"})
    quiet = type("Quiet", (), {"write": lambda self, line: None})()
    try:
        records = [trainer.train_step(step, logger=quiet) for step in (1, 2, 3)]
    finally:
        trainer.rollouts.close()
    assert [r["async/staleness"] for r in records] == [0, 1, 1]
    assert all(1 <= r["turns_mean"] <= 2 and "loss" in r for r in records)
