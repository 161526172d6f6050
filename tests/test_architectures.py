"""The model families users train, as tiny random models built from transformers' own config classes: Qwen2 (attention
bias; once with its sliding window), Qwen3 (q/k norms), Llama 3 (llama3 rope scaling, untied head), Mistral, Gemma 2
and 3 (sliding and full layers, soft caps), Phi-3 (fused qkv_proj and gate_up_proj). Sliding windows of 8 columns,
shorter than prompt and completion, as long reasoning traces are on the real models. On each: HFRollout's greedy
tokens are model.generate's, and its sampled log-probs a plain forward's; StaticRollout's tokens and log-probs are
HFRollout's (for the families tests/test_static_sliding_window.py does not cover); the grouped training forward
(completion_logprobs), eager and with compiled decoder layers, gives a plain forward's log-probs and gradients; one
GRPO step runs on the static engine, with and without LoRA on every linear layer (fused projections included)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers
from test_rollout import RaggedArithmetic, reference_logprobs
from test_static_rollout import reset_env  # 12 rows in groups of 3, ragged prompts (left padding), 16 new tokens
from test_static_sliding_window import FAMILIES as SLIDING_FAMILIES
from test_static_sliding_window import WINDOW, sliding_model

from algos.model.policy import completion_logprobs, position_ids_from_mask
from algos.rollout import HFRollout, row_seeds
from algos.rollout.static import StaticRollout
from rlvr_env import TokenVectorEnv
from rlvr_env.testing import build_char_tokenizer

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               # 64 positions of original context: the low frequencies of a head of 8 are rescaled within our rows
               "original_max_position_embeddings": 64, "rope_theta": 10000.0}

# name -> (transformers' class prefix, config fields over the shared ones); the sliding ones come from
# tests/test_static_sliding_window.py (3 layers: Gemma 3's and Qwen2's mixes of layer types)
OWN_FAMILIES = {
    "qwen2": ("Qwen2", {}),  # q/k/v with bias, no window
    "qwen3": ("Qwen3", {"head_dim": 8}),  # RMSNorm on queries and keys
    "llama3": ("Llama", {"rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": False}),
    "phi3": ("Phi3", {"sliding_window": WINDOW}),  # fused qkv_proj and gate_up_proj, every layer sliding
}
SLIDING = {"mistral": "mistral", "gemma2": "gemma2", "gemma3": "gemma3", "qwen2-sliding": "qwen2"}
ALL_FAMILIES = [*OWN_FAMILIES, *SLIDING]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def family_model(tokenizer, family: str) -> transformers.PreTrainedModel:
    """A tiny random model of ``family`` (fp32, SDPA, eval mode), the same for the same name."""
    if family in SLIDING:
        assert SLIDING[family] in SLIDING_FAMILIES
        return sliding_model(tokenizer, SLIDING[family])
    prefix, fields = OWN_FAMILIES[family]
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **fields)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return getattr(transformers, f"{prefix}ForCausalLM")(config).eval()


@pytest.fixture(scope="module", params=ALL_FAMILIES)
def family(request, tokenizer):
    return request.param, family_model(tokenizer, request.param)


def test_the_families_are_what_they_claim(tokenizer):
    """The features each family is here for are really on: a window shorter than the rows, bias, llama3 rope."""
    models = {name: family_model(tokenizer, name) for name in ("qwen2", "llama3", "phi3", "qwen2-sliding")}
    assert models["qwen2"].model.layers[0].self_attn.q_proj.bias is not None
    assert models["qwen2"].config.sliding_window is None
    assert models["llama3"].model.rotary_emb.rope_type == "llama3"
    assert models["llama3"].lm_head.weight is not models["llama3"].model.embed_tokens.weight
    assert hasattr(models["phi3"].model.layers[0].self_attn, "qkv_proj")
    assert hasattr(models["phi3"].model.layers[0].mlp, "gate_up_proj")
    assert models["phi3"].config.sliding_window == WINDOW
    assert "sliding_attention" in models["qwen2-sliding"].config.layer_types


def test_hf_rollouts_greedy_tokens_are_generates(family, tokenizer):
    """HFRollout (its shared prompt cache, rows leaving the cache as they finish) against model.generate over the same
    left-padded prompts, greedy."""
    name, model = family
    env = reset_env(tokenizer)
    rollout = HFRollout().generate(model, env, greedy=True)
    assert env.prompt_width > 4 * WINDOW
    with torch.no_grad():
        generated = model.generate(input_ids=env.prompt_ids, attention_mask=env.prompt_mask, do_sample=False,
                                   max_new_tokens=env.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                   eos_token_id=tokenizer.eos_token_id)[:, env.prompt_width:]
    width = rollout.response_ids.shape[1]
    mask = rollout.response_mask.bool()
    assert torch.equal(rollout.response_ids[mask], generated[:, :width][mask]), name


def test_hf_rollouts_sampled_log_probs_are_a_plain_forwards(family, tokenizer):
    """Sampled rows that stop at ragged lengths (a tenth of the vocabulary stops them), so finished rows leave
    HFRollout's cache mid-rollout: each log-prob is one plain forward's over the prompt and the tokens before it."""
    name, model = family
    stops = tokenizer.convert_tokens_to_ids(list("aeiouAEIOU"))
    env = TokenVectorEnv(RaggedArithmetic(), tokenizer, num_envs=12, max_new_tokens=16, stop_token_ids=stops)
    env.reset(seed=5, options={"group_size": 3})
    rollout = HFRollout().generate(model, env, seeds=row_seeds(3, range(12)))
    lengths = rollout.response_mask.sum(-1)
    assert lengths.min() < 8 and lengths.max() > 12  # the cache was compacted, and rows went on past the window
    expected = reference_logprobs(model, env, rollout, temperature=1.0)
    mask = rollout.response_mask.bool()
    torch.testing.assert_close(rollout.logprobs[mask], expected[mask], atol=1e-5, rtol=0, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("sampling", [{"greedy": True}, {}])
@pytest.mark.parametrize("name", [name for name in ALL_FAMILIES if name not in SLIDING])
def test_static_rollouts_are_hf_rollouts(name, tokenizer, sampling):
    """StaticRollout's fixed-shape decode (its own masks and cache) against HFRollout, for the same row seeds (the
    sliding-window families are tests/test_static_sliding_window.py's)."""
    model = family_model(tokenizer, name)
    seeds = row_seeds(11, range(12))
    dynamic = HFRollout().generate(model, reset_env(tokenizer), seeds=seeds, **sampling)
    static = StaticRollout(check_every=4, graph="eager").generate(model, reset_env(tokenizer), seeds=seeds, **sampling)
    assert torch.equal(static.response_ids, dynamic.response_ids)
    assert torch.equal(static.response_mask, dynamic.response_mask)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, atol=1e-5, rtol=0)


def ragged_groups(vocab: int):
    """Two groups of three rows, interleaved, with left-padded prompts of two lengths (14 and 9 tokens) and completions
    of 1-12 tokens (right padding): rows of up to 26 tokens, several windows long -> (ids, mask, prompt width)."""
    generator = torch.Generator().manual_seed(0)
    prompt_width, completion_width = 16, 12
    prompts = torch.randint(4, vocab, (2, prompt_width), generator=generator)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[:, :2] = 0  # two columns of padding in every row
    prompt_mask[1, :7] = 0
    order = [0, 1, 0, 1, 1, 0]
    ids = torch.cat([prompts[order], torch.randint(4, vocab, (6, completion_width), generator=generator)], 1)
    mask = torch.cat([prompt_mask[order], torch.ones(6, completion_width, dtype=torch.long)], 1)
    for row, length in enumerate([12, 3, 1, 10, 7, 5]):
        mask[row, prompt_width + length:] = 0
    return ids, mask, prompt_width


def training_logprobs_and_gradients(model, ids, mask, prompt_width, plain: bool):
    """(log-probs [B, T], entropy, gradients) of the training forward, or of one plain forward over whole rows."""
    model.zero_grad()
    valid = mask[:, prompt_width:].bool()
    if plain:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        full = torch.log_softmax(logits[:, prompt_width - 1 : -1].float(), -1)
        logp = full.gather(-1, ids[:, prompt_width:, None])[..., 0]
        entropy = -(full.exp() * full).sum(-1)
    else:
        logp, entropy = completion_logprobs(model, ids, mask, prompt_width, chunk_size=5)
    (logp * valid).sum().backward()
    return logp * valid, entropy * valid, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("layers", ["eager", "compiled"])
def test_training_logprobs_are_a_plain_forwards(family, tokenizer, layers):
    """completion_logprobs (shared prompt cache, completions packed several to a decoder row where the window allows;
    or, with compiled layers, rows whole through torch.compile's graph, Dynamo's "eager" backend: no compiler)
    against a plain forward: log-probs, entropy and gradients."""
    import torch._dynamo

    from algos.model.compiled import _COMPILED, compile_decoder_layers

    name, model = family
    ids, mask, prompt_width = ragged_groups(len(tokenizer))
    expected = training_logprobs_and_gradients(model, ids, mask, prompt_width, plain=True)
    if layers == "compiled":
        if os.environ.get("MUTANT_UNDER_TEST"):
            pytest.skip("mutmut's trampolines are not traceable by dynamo")
        torch._dynamo.reset()
        compile_decoder_layers(model, backend="eager")
    try:
        got = training_logprobs_and_gradients(model, ids, mask, prompt_width, plain=False)
        assert (model in _COMPILED) == (layers == "compiled")  # a layer Dynamo could not trace would fall back eager
    finally:
        _COMPILED.pop(model, None)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=0, msg=lambda m: f"{name} log-probs: {m}")
    torch.testing.assert_close(got[1], expected[1], atol=1e-5, rtol=0, msg=lambda m: f"{name} entropy: {m}")
    for ours, theirs in zip(got[2], expected[2]):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_gemma2_under_eager_attention_gives_a_plain_forwards_training_logprobs(tokenizer):
    """Eager attention (what applies Gemma 2's attention soft cap; SDPA drops it) takes additive masks and its own
    sliding-window overlay: the training forward is the plain forward there too. (On a tiny random model the cap
    itself moves log-probs by ~1e-6 at most: this checks the masks and the cache, not the cap.)"""
    model = sliding_model(tokenizer, "gemma2", attention="eager")
    ids, mask, prompt_width = ragged_groups(len(tokenizer))
    expected = training_logprobs_and_gradients(model, ids, mask, prompt_width, plain=True)
    got = training_logprobs_and_gradients(model, ids, mask, prompt_width, plain=False)
    for ours, theirs in zip([got[0], got[1], *got[2]], [expected[0], expected[1], *expected[2]]):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def saved_families(tmp_path_factory, tokenizer):
    """Each family's tiny model with the tokenizer, saved as a run loads a model: name -> directory."""
    root = tmp_path_factory.mktemp("families")
    for name in ALL_FAMILIES:
        family_model(tokenizer, name).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return {name: root / name for name in ALL_FAMILIES}


def grpo_overrides(model_dir, output_dir, **extra) -> dict[str, str]:
    from rlvr_env.testing import ADDITION_KWARGS

    return {"model.path": str(model_dir), "model.autocast": "null", "run.output_dir": str(output_dir),
            "run.steps": "1", "run.progress": "false", "run.tensorboard": "false", "run.plots": "false",
            "env.use_chat_template": "false", "env.kwargs": json.dumps(ADDITION_KWARGS), "env.max_new_tokens": "12",
            "env.eval_size": "4", "rollout.prompts_per_step": "2", "rollout.group_size": "4", "optim.lr": "1e-2",
            # random models earn no reward: the entropy bonus gives every step a gradient
            "loss.entropy_coef": "0.01",
            "rollout.backend": "static", "static.decode_graph": "eager", **extra}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_one_grpo_step_on_the_static_engine(name, lora, saved_families, tokenizer, tmp_path):
    """A GRPO step whose rollout comes from the static engine (prompts of ~8 tokens + 12 new ones, past the window):
    the training forward scores the sampled tokens as the engine did, and the weights move (an entropy bonus: a random
    model earns no reward). With LoRA, r 4 on 'all-linear' adapts every projection, fused ones included (Phi-3's
    qkv_proj and gate_up_proj), and the engine samples from its merged copy."""
    from algos.algorithms.grpo import GRPOConfig, GRPOTrainer
    from algos.config import load_config
    from algos.model.lora import has_lora, linear_module_names
    from algos.run.reporting import SilentLogger

    adapter = {"lora.r": "4", "lora.alpha": "8"} if lora else {}
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=grpo_overrides(saved_families[name], tmp_path, **adapter)))
    assert isinstance(trainer.backend, StaticRollout)
    model = trainer.model
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    if lora:
        from peft.tuners.lora import LoraLayer

        assert has_lora(model)
        adapted = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, LoraLayer)}
        assert adapted == set(linear_module_names(family_model(tokenizer, name)))  # fused qkv_proj / gate_up_proj too (Phi-3)
        assert trained and all("lora_" in n for n in trained)
    metrics = trainer.train_step(1, SilentLogger())
    assert has_lora(model) == lora
    assert metrics["rollout_logp_abs_diff"] < 1e-4, name  # the engine's log-probs are the training forward's
    assert metrics["grad_norm"] > 0, name
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, trained[n])]
    assert moved, name


def test_one_ppo_step_scores_the_sampled_tokens_through_gemma2s_soft_capped_head(saved_families, tmp_path):
    """PPO's training forward (its critic a head on the policy's backbone: the log-probs come from that pass's hidden
    states) goes through the model's own logit transform, Gemma 2's final soft cap (3.0), as the engine's sampling
    does: 2e-7 apart; without the cap 8e-5 on this tiny random model, whose logits stay below 0.5."""
    from algos.algorithms.ppo import PPOConfig, PPOTrainer
    from algos.config import load_config
    from algos.run.reporting import SilentLogger

    overrides = grpo_overrides(saved_families["gemma2"], tmp_path, **{"rollout.group_size": "1", "ppo.num_minibatches": "1",
                                                                        "ppo.ppo_epochs": "1"})
    trainer = PPOTrainer(load_config(PPOConfig, overrides=overrides))
    assert trainer.critic.shares_policy_backbone
    metrics = trainer.train_step(1, SilentLogger())
    assert metrics["rollout_logp_abs_diff"] < 1e-5
    assert metrics["grad_norm"] > 0
