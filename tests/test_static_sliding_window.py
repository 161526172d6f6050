"""StaticRollout (algos/rollout/static.py) on models whose layers attend through a sliding window: its own masks give
the tokens and log-probs of HFRollout, which decodes under transformers' own masks and caches. Every layer sliding
(Mistral), sliding and full layers alternating (Gemma 2 and 3) or full then sliding (Qwen2's max_window_layers), with a
window of 8 columns and rows of ~80 (prompts of 66 columns, left-padded, then 16 tokens)."""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from test_static_rollout import reset_env  # 12 rows in groups of 3, ragged prompts: left padding

from algos.rollout import HFRollout, row_seeds
from algos.rollout.static import AttentionLayout, StaticRollout, attention_layout
from rlvr_env.testing import build_char_tokenizer, build_tiny_model

WINDOW = 8

# name -> (transformers' class prefix, config fields over the shared ones)
FAMILIES = {
    "mistral": ("Mistral", {}),  # every layer slides: one mask
    # alternating (sliding first), attention and final logits soft-capped
    "gemma2": ("Gemma2", {"head_dim": 8, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
    "qwen2": ("Qwen2", {"use_sliding_window": True, "max_window_layers": 1}),  # layer 0 full, the others sliding
    "gemma3": ("Gemma3Text", {"head_dim": 8, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def sliding_model(tokenizer, family: str, attention: str = "sdpa", window: int = WINDOW):
    prefix, fields = FAMILIES[family]
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, sliding_window=window, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **fields)
    config._attn_implementation = attention
    torch.manual_seed(0)
    model_class = transformers.Gemma3ForCausalLM if prefix == "Gemma3Text" else getattr(transformers,
                                                                                         f"{prefix}ForCausalLM")
    return model_class(config).eval()


@pytest.fixture(scope="module", params=list(FAMILIES))
def model(request, tokenizer):
    return sliding_model(tokenizer, request.param)


@pytest.mark.parametrize("sampling", [{"greedy": True}, {}, {"temperature": 0.7, "top_k": 5}])
def test_same_tokens_and_log_probs_as_hf_rollout_under_a_sliding_window(model, tokenizer, sampling):
    seeds = row_seeds(11, range(12))
    env = reset_env(tokenizer)
    assert env.prompt_width > 4 * WINDOW  # the window bites in the prefill and in every decode step
    dynamic = HFRollout().generate(model, env, seeds=seeds, **sampling)
    static = StaticRollout(check_every=3, graph="eager").generate(model, reset_env(tokenizer), seeds=seeds, **sampling)
    assert torch.equal(static.response_ids, dynamic.response_ids)
    assert torch.equal(static.response_mask, dynamic.response_mask)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, atol=1e-5, rtol=0)


def test_gemma2_under_eager_attention_soft_caps_its_scores_as_hf_rollout_does(tokenizer):
    """SDPA has no soft cap (transformers' SDPA attention drops it); eager attention applies it: the same there too."""
    model = sliding_model(tokenizer, "gemma2", attention="eager")
    seeds = row_seeds(3, range(12))
    dynamic = HFRollout().generate(model, reset_env(tokenizer), seeds=seeds)
    static = StaticRollout(check_every=4, graph="eager").generate(model, reset_env(tokenizer), seeds=seeds)
    assert torch.equal(static.response_ids, dynamic.response_ids)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_continuations_are_the_models_own_full_forward(tokenizer, family):
    """continue_rows (multi-turn turns): contexts of several lengths, left-padded into one bucket, each longer than the
    window; every greedy token is the argmax, and its log-prob the log-softmax, of one plain forward of the model
    over the context and the tokens before it."""
    model = sliding_model(tokenizer, family)
    contexts = [tokenizer.encode(text, add_special_tokens=False) for text in ("12+34=", "1+2+3+4+5+6+7=", "98*76=")]
    vocab = len(tokenizer) - 1  # a stop id never drawn: every row takes its whole budget
    continued = StaticRollout(check_every=2, graph="eager").continue_rows(
        model, contexts, max_new_tokens=[12, 9, 14], stop_ids=[vocab], vocab_size=vocab, greedy=True)
    for context, (tokens, logprobs) in zip(contexts, continued):
        ids = torch.tensor([context + tokens])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, len(context) - 1 : -1, :vocab]
        expected = torch.log_softmax(logits.float(), -1)
        assert tokens == expected.argmax(-1).tolist()
        torch.testing.assert_close(torch.tensor(logprobs), expected.gather(-1, torch.tensor(tokens)[:, None])[:, 0],
                                   atol=1e-5, rtol=0)


@pytest.mark.skipif(bool(os.environ.get("MUTANT_UNDER_TEST")), reason="mutmut's trampolines are not traceable by dynamo")
def test_compiled_steps_take_the_window_whole_and_never_recompile(tokenizer):
    """torch.compile(fullgraph=True): the sliding mask (one tensor, or a dict of masks by layer type) is built inside
    the traced steps, with no graph break and no recompile over two batches of one bucket."""
    import torch._dynamo

    torch._dynamo.reset()
    model = sliding_model(tokenizer, "gemma2")  # a dict of masks: the harder case
    seeds = row_seeds(5, range(12))
    engine = StaticRollout(check_every=4, graph="compile", compile_options={"backend": "eager"})
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = [engine.generate(model, reset_env(tokenizer, seed=seed), seeds=seeds) for seed in (5, 6)]
    torch._dynamo.reset()
    for rollout, seed in zip(compiled, (5, 6)):
        expected = HFRollout().generate(model, reset_env(tokenizer, seed=seed), seeds=seeds)
        assert torch.equal(rollout.response_ids, expected.response_ids)
        torch.testing.assert_close(rollout.logprobs, expected.logprobs, atol=1e-5, rtol=0)


def test_the_layout_follows_the_layers_that_use_a_window(tokenizer):
    assert attention_layout(sliding_model(tokenizer, "mistral")) == AttentionLayout(window=WINDOW, keyed=False)
    assert attention_layout(sliding_model(tokenizer, "gemma2")) == AttentionLayout(window=WINDOW, keyed=True)
    assert attention_layout(sliding_model(tokenizer, "qwen2")) == AttentionLayout(window=WINDOW, keyed=True)
    qwen2_full = sliding_model(tokenizer, "qwen2")
    qwen2_full.config.layer_types = ["full_attention"] * 3  # max_window_layers >= its layers: no sliding layer
    assert attention_layout(qwen2_full) == AttentionLayout()
    llama = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    llama.config.sliding_window = WINDOW  # Llama's layers never read it: transformers masks them causally
    assert attention_layout(llama) == AttentionLayout()
    assert AttentionLayout(window=WINDOW).within(WINDOW) == AttentionLayout()  # a window spanning every column
    assert AttentionLayout(window=WINDOW).within(WINDOW + 1) == AttentionLayout(window=WINDOW)


def test_attention_it_cannot_mask_is_refused_in_one_line(tokenizer):
    chunked = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    chunked.config.attention_chunk_size = 4
    mixed = sliding_model(tokenizer, "qwen2")
    mixed.config.layer_types = ["full_attention", "linear_attention", "sliding_attention"]
    for model, match in ((chunked, "chunked or bidirectional"), (mixed, r"\['full_attention', 'linear_attention'")):
        with pytest.raises(ValueError, match=match):
            StaticRollout(graph="eager").generate(model, reset_env(tokenizer), seeds=row_seeds(0, range(12)))


def test_auto_gives_way_to_hf_for_a_model_the_static_engine_refuses(tokenizer, caplog):
    """On a GPU "auto" picks the static engine; a model it cannot mask exactly samples with "hf", said in one line."""
    import types

    from algos.rollout import engine_for_model

    chunked = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    chunked.config.attention_chunk_size = 4
    config = types.SimpleNamespace(rollout=types.SimpleNamespace(backend="static"))
    with caplog.at_level("WARNING", logger="rlvr"):
        assert engine_for_model(config, chunked.config) == "hf" == config.rollout.backend
    assert caplog.messages == ["rollout.backend 'auto' -> 'hf' instead of 'static': StaticRollout builds causal and "
                               "sliding-window masks only, and llama attends otherwise (chunked or "
                               "bidirectional attention)"]
    config.rollout.backend = "static"
    assert engine_for_model(config, sliding_model(tokenizer, "gemma2").config) == "static"  # a window it masks


def test_a_window_of_the_whole_row_changes_nothing(tokenizer):
    """A window wider than prompt and completion together: the engine passes one causal mask, as before."""
    model = sliding_model(tokenizer, "gemma2", window=4096)
    calls = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: calls.append(kwargs["attention_mask"]),
                                           with_kwargs=True)
    try:
        StaticRollout(check_every=4, graph="eager").generate(model, reset_env(tokenizer), seeds=row_seeds(0, range(12)))
    finally:
        hook.remove()
    assert calls and all(isinstance(mask, torch.Tensor) for mask in calls)

