"""StaticRollout (algos/rollout/static.py): fixed-shape decoding gives HFRollout's tokens and log-probs for the same
row seeds, every decode step has one shape, torch.compile traces it whole with no recompile, and the decoder's own
copy of the weights follows the policy in place. The CUDA graph itself is exercised by the last tests on a GPU."""

from __future__ import annotations

import os
import types

import pytest
import torch
from test_rollout import RaggedArithmetic  # prompts of different lengths: left padding

from algos.config import RolloutConfig
from algos.rollout import ROLLOUT_ENGINES, HFRollout, make_rollout_backend, resolve_rollout_backend, row_seeds
from algos.rollout.static import FixedKVCache, StaticEngineConfig, StaticRollout, additive_mask, fuse_rms_norms
from rlvr_env import TokenVectorEnv
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, seed=3).eval()


def reset_env(tokenizer, num_envs=12, group_size=3, max_new_tokens=16, device="cpu", seed=5):
    env = TokenVectorEnv(RaggedArithmetic(), tokenizer, num_envs=num_envs, max_new_tokens=max_new_tokens,
                         device=torch.device(device))
    env.reset(seed=seed, options={"group_size": group_size})
    return env


@pytest.mark.parametrize("sampling", [{}, {"greedy": True}, {"temperature": 0.7, "top_k": 5},
                                      {"temperature": 1.3, "top_p": 0.8}])
def test_same_tokens_and_log_probs_as_hf_rollout_for_the_same_row_seeds(model, tokenizer, sampling):
    seeds = row_seeds(11, range(12))
    dynamic = HFRollout().generate(model, reset_env(tokenizer), seeds=seeds, **sampling)
    static = StaticRollout(check_every=3).generate(model, reset_env(tokenizer), seeds=seeds, **sampling)
    assert torch.equal(static.response_ids, dynamic.response_ids)
    assert torch.equal(static.response_mask, dynamic.response_mask)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, atol=1e-5, rtol=0)
    assert torch.equal(static.truncated, dynamic.truncated) and torch.equal(static.scores, dynamic.scores)


def test_every_decode_step_has_the_same_shapes_and_rows_run_to_the_check(model, tokenizer):
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: shapes.append((kwargs["input_ids"].shape, kwargs["attention_mask"].shape)),
        with_kwargs=True)
    try:
        env = reset_env(tokenizer, max_new_tokens=14)
        rollout = StaticRollout(check_every=4).generate(model, env, seeds=row_seeds(0, range(12)))
    finally:
        hook.remove()
    prefill, *decode = shapes
    assert prefill[0][0] == 4  # one row per distinct prompt (12 rows, groups of 3)
    # Every row decodes each step, finished or not, into a cache sized once: the prompt width rounded up to 32,
    # + 14 tokens + 4 of overshoot for the last group of steps
    bucket = -(-env.prompt_width // 32) * 32
    assert decode and set(decode) == {(torch.Size([12, 1]), torch.Size([12, 1, 1, bucket + 14 + 4]))}
    assert len(decode) % 4 == 0  # whole groups of check_every steps between the host's checks
    assert rollout.response_ids.shape[1] <= 14


def test_rows_that_finish_early_end_the_loop_at_the_next_check(model, tokenizer):
    every_token_stops = TokenVectorEnv(RaggedArithmetic(), tokenizer, num_envs=12, max_new_tokens=16,
                                       stop_token_ids=list(range(len(tokenizer))))
    every_token_stops.reset(seed=5, options={"group_size": 3})
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        rollout = StaticRollout(check_every=4).generate(model, every_token_stops, seeds=row_seeds(0, range(12)))
    finally:
        hook.remove()
    assert len(calls) == 1  # the prefill: its first token ended every row, so no decode step ran
    assert rollout.response_ids.shape[1] == 1 and not rollout.truncated.any()


@pytest.mark.skipif(bool(os.environ.get("MUTANT_UNDER_TEST")), reason="mutmut's trampolines are not traceable by dynamo")
def test_compiled_decode_step_traces_whole_and_never_recompiles(model, tokenizer):
    """torch.compile(fullgraph=True, dynamic=False): a graph break raises, a recompile raises (error_on_recompile),
    over two whole rollouts of one bucket; the "eager" backend checks the tracing without a compiler."""
    import torch._dynamo

    torch._dynamo.reset()
    seeds = row_seeds(2, range(12))
    engine = StaticRollout(check_every=4, graph="compile", compile_options={"backend": "eager"})
    with torch._dynamo.config.patch(error_on_recompile=True):
        first = engine.generate(model, reset_env(tokenizer), seeds=seeds)
        second = engine.generate(model, reset_env(tokenizer, seed=6), seeds=seeds)
    eager = StaticRollout(check_every=4, graph="eager")
    assert torch.equal(first.response_ids, eager.generate(model, reset_env(tokenizer), seeds=seeds).response_ids)
    assert torch.equal(second.response_ids, eager.generate(model, reset_env(tokenizer, seed=6), seeds=seeds).response_ids)
    torch._dynamo.reset()


@pytest.mark.skipif(bool(os.environ.get("MUTANT_UNDER_TEST")), reason="mutmut's trampolines are not traceable by dynamo")
def test_each_compiled_bucket_has_its_own_graph_past_dynamos_limit(model, tokenizer):
    """Multi-turn continuations pass through many (rows, width) buckets: more than dynamo's recompile_limit (8), which
    under fullgraph is an error when one function's graphs pile up. Each bucket compiles its own copy of the steps,
    once: no recompile at all over more buckets than the limit (lowered to 2 here, so three buckets show it)."""
    import torch._dynamo

    torch._dynamo.reset()
    engine = StaticRollout(check_every=2, graph="compile", compile_options={"backend": "eager"})
    eager = StaticRollout(check_every=2, graph="eager")
    vocab = len(tokenizer) - 1  # a stop id never drawn: every row takes its whole budget
    with torch._dynamo.config.patch(error_on_recompile=True, recompile_limit=2):
        for rows, text in ((1, "1="), (2, "1="), (3, "2" * 40 + "=")):  # three (rows, width) buckets
            contexts = [tokenizer.encode(text, add_special_tokens=False)] * rows
            arguments = dict(max_new_tokens=[4] * rows, stop_ids=[vocab], vocab_size=vocab, greedy=True)
            compiled = engine.continue_rows(model, contexts, **arguments)
            assert [tokens for tokens, _ in compiled] == [tokens for tokens, _ in eager.continue_rows(
                model, contexts, **arguments)]
    assert len(engine._states) == 3
    torch._dynamo.reset()


def test_its_own_copy_is_refreshed_in_place_after_an_optimizer_step(tokenizer):
    policy = build_tiny_model(tokenizer, seed=4)
    engine = StaticRollout(decode_dtype=torch.bfloat16)
    engine.generate(policy, reset_env(tokenizer), seeds=row_seeds(0, range(12)))
    decoder = engine._decoder
    assert decoder is not policy and next(decoder.parameters()).dtype == torch.bfloat16
    addresses = [p.data_ptr() for p in decoder.parameters()]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.05)
    policy(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    optimizer.step()
    stale = [p.clone() for p in decoder.parameters()]
    engine.generate(policy, reset_env(tokenizer), seeds=row_seeds(1, range(12)))
    assert engine._decoder is decoder and [p.data_ptr() for p in decoder.parameters()] == addresses
    for mine, theirs, old in zip(decoder.parameters(), policy.parameters(), stale):
        assert torch.equal(mine, theirs.to(torch.bfloat16)) and not torch.equal(mine, old)
    assert not any(p.requires_grad for p in decoder.parameters())


def test_bf16_samples_are_scored_by_the_bf16_copy(tokenizer):
    """The copy samples in bf16: its log-probs are the bf16 model's (what the mismatch metrics compare with)."""
    policy = build_tiny_model(tokenizer, seed=4)
    seeds = row_seeds(3, range(12))
    static = StaticRollout(decode_dtype=torch.bfloat16).generate(policy, reset_env(tokenizer), seeds=seeds)
    reference = HFRollout().generate(policy.to(torch.bfloat16), reset_env(tokenizer), seeds=seeds)
    agree = (static.response_ids == reference.response_ids).float().mean()
    assert agree > 0.9  # bf16 attention over a padded cache rounds differently in a few places
    assert static.logprobs.dtype == torch.float32


def test_the_copys_rms_norms_are_fused_and_give_the_same_output(tokenizer):
    model = build_tiny_model(tokenizer, seed=2).to(torch.bfloat16)
    hidden = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    before = [norm(hidden) for norm in norms]
    assert fuse_rms_norms(model) == len(norms) == 5  # 2 per layer + the final one
    for norm, out in zip(norms, before):
        assert "forward" in vars(norm)  # the instance's own forward: the policy's class is untouched
        torch.testing.assert_close(norm(hidden), out, atol=2e-2, rtol=2e-2)

    class OnePlusWeightRMSNorm(torch.nn.Module):  # Gemma's form, which F.rms_norm does not compute
        def __init__(self):
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.full((8,), 0.5)), 1e-6

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight)

    assert fuse_rms_norms(OnePlusWeightRMSNorm()) == 0


def test_fixed_cache_writes_at_its_column_and_keeps_its_shape():
    cache = FixedKVCache(rows=2, width=6, device=torch.device("cpu"))
    key = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2)
    cache.column.fill_(1)
    keys, values = cache.update(key, -key, 0)
    assert keys.shape == (2, 1, 6, 2) and torch.equal(keys[:, :, 1:4], key) and torch.equal(values[:, :, 1:4], -key)
    assert not keys[:, :, 0].any() and not keys[:, :, 4:].any()


def test_additive_mask_is_zero_where_allowed_and_the_lowest_value_elsewhere():
    mask = additive_mask(torch.tensor([[True, False]]), torch.bfloat16)
    assert mask.tolist() == [[0.0, torch.finfo(torch.bfloat16).min]]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="graph"):
        StaticRollout(graph="fast")
    with pytest.raises(ValueError, match="check_every"):
        StaticRollout(check_every=0)
    config = StaticEngineConfig(decode_graph="always")
    with pytest.raises(ValueError, match="static.decode_graph"):
        config.validate()


def test_a_cuda_graph_needs_cuda(model, tokenizer):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA"):
        StaticRollout(graph="cuda").generate(model, reset_env(tokenizer))


def test_auto_backend_is_static_on_a_gpu_and_hf_elsewhere():
    def config(env_id):
        return types.SimpleNamespace(rollout=RolloutConfig(), env=types.SimpleNamespace(id=env_id))

    assert resolve_rollout_backend(config("rlvr/Arithmetic-v0"), torch.device("cuda")) == "static"
    assert resolve_rollout_backend(config("rlvr/Arithmetic-v0"), torch.device("cpu")) == "hf"
    assert resolve_rollout_backend(config("rlvr/CalculatorArithmetic-v0"), torch.device("cuda")) == "static"
    assert resolve_rollout_backend(config("rlvr/CalculatorArithmetic-v0"), torch.device("cpu")) == "hf"
    named = config("rlvr/Arithmetic-v0")
    named.rollout.backend = "static"
    assert resolve_rollout_backend(named, torch.device("cpu")) == "static"  # a named engine stays
    assert ROLLOUT_ENGINES["static"].own_weights  # rollout correction "auto" corrects its bf16 samples


def test_the_static_engine_is_built_from_the_config(tmp_path):
    from algos.algorithms.grpo import GRPOConfig
    from algos.config import load_config

    config = load_config(GRPOConfig, overrides={"rollout.backend": "static", "static.decode_graph": "eager",
                                                "model.autocast": "bfloat16", "rollout.top_k": "4"})
    backend = make_rollout_backend(config)
    assert isinstance(backend, StaticRollout)
    assert backend.decode_dtype == torch.bfloat16 and backend.graph_mode == "eager" and backend.params.top_k == 4


def test_grpo_trains_with_the_static_engine(tmp_path):
    """A GRPO run samples with it, with rollout correction on (as for any engine with its own weights)."""
    import json

    from algos.algorithms.grpo import GRPOConfig, GRPOTrainer, train
    from algos.config import load_config
    from algos.run.reporting import read_metrics
    from rlvr_env.testing import ADDITION_KWARGS

    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    overrides = {
        "model.path": str(tmp_path / "tiny"), "model.autocast": "null", "run.output_dir": str(tmp_path / "run"),
        "run.steps": "2", "run.progress": "false", "run.tensorboard": "false", "run.plots": "false",
        "env.use_chat_template": "false", "env.kwargs": json.dumps(ADDITION_KWARGS), "env.max_new_tokens": "4",
        "env.eval_size": "4", "rollout.prompts_per_step": "2", "rollout.group_size": "4", "rollout.backend": "static"}
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides))
    assert isinstance(trainer.backend, StaticRollout) and trainer.rollout_correction == "tis"
    train(load_config(GRPOConfig, overrides=overrides))
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows if "reward_mean" in row] == [1, 2]
    assert load_config(GRPOConfig, tmp_path / "run" / "config.yaml").rollout.backend == "static"


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_cuda_graph_replays_give_the_eager_steps_tokens(tokenizer):
    model = build_tiny_model(tokenizer, seed=3).cuda().eval()
    seeds = row_seeds(7, range(12))
    eager = StaticRollout(graph="eager").generate(model, reset_env(tokenizer, device="cuda"), seeds=seeds)
    engine = StaticRollout(graph="cuda")
    for seed in (5, 5, 9):  # captured once, replayed for the next batches of the bucket
        graphed = engine.generate(model, reset_env(tokenizer, device="cuda", seed=seed), seeds=seeds)
        if seed == 5:
            assert torch.equal(graphed.response_ids, eager.response_ids)
            torch.testing.assert_close(graphed.logprobs, eager.logprobs, atol=1e-5, rtol=0)
    assert len(engine._states) == 1


@cuda
def test_training_gradients_with_the_chosen_attention_kernels_match_the_math_kernel(tokenizer):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from algos.system.hardware import choose_attention_kernels

    choose_attention_kernels(torch.device("cuda"))
    env = reset_env(tokenizer, device="cuda")
    model = build_tiny_model(tokenizer, seed=3).cuda()
    rollout = StaticRollout().generate(model, env, seeds=row_seeds(0, range(12)))
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)

    def gradients():
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        (logits.float().log_softmax(-1).mean()).backward()
        return [p.grad.clone() for p in model.parameters()]

    chosen = gradients()
    with sdpa_kernel(SDPBackend.MATH):
        math = gradients()
    for a, b in zip(chosen, math):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_its_settings_are_kept():
    engine = StaticRollout(temperature=0.5, top_p=0.9, top_k=3, seed=3, check_every=1)
    assert (engine.params.temperature, engine.params.top_p, engine.params.top_k) == (0.5, 0.9, 3)
    assert torch.equal(engine.generator.get_state(), torch.Generator().manual_seed(3).get_state())
    default = StaticRollout()
    assert default.check_every == 8 and default.compile_options == {} and default.generator is None
    assert default.graph_mode == "auto" and default.decode_dtype is None


def test_continuations_take_their_whole_budget_and_a_few_buckets_stay(model, tokenizer):
    """A stop id the engine never samples (ids from vocab_size on are not drawn): each context takes exactly its
    budget, to the last token even when check_every is 1; five row buckets leave the four newest, each holding its
    KV cache."""
    engine = StaticRollout(check_every=1)
    vocab = len(tokenizer) - 1
    context = tokenizer.encode("12+3=", add_special_tokens=False)
    for count in (1, 2, 3, 5, 9):  # row buckets 1, 2, 4, 8, 16
        continued = engine.continue_rows(model, [context] * count, max_new_tokens=[3] * (count - 1) + [5],
                                         stop_ids=[vocab], vocab_size=vocab, greedy=True)
        assert [len(tokens) for tokens, _ in continued] == [3] * (count - 1) + [5]
        assert all(token < vocab for tokens, _ in continued for token in tokens)
    assert [key[0] for key in engine._states] == [2, 4, 8, 16]


def test_padding_rows_are_done_from_the_start(model, tokenizer):
    """Three contexts decode as four rows; when every real row stops at its first token, no decode step runs."""
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        continued = StaticRollout(check_every=2).continue_rows(
            model, [tokenizer.encode(text, add_special_tokens=False) for text in ("1=", "22=", "333=")],
            max_new_tokens=[6, 6, 6], stop_ids=list(range(len(tokenizer))), vocab_size=len(tokenizer), greedy=True)
    finally:
        hook.remove()
    assert len(calls) == 1 and [len(tokens) for tokens, _ in continued] == [1, 1, 1]
