"""The trainer machinery GRPO/DAPO/PPO share: checkpoints, log-probs, the update engine's parts (metrics logging:
test_reporting.py)."""

import contextlib
import gc
import os
import random
import warnings
import weakref

import numpy as np
import pytest
import torch

from algos.run.checkpoint import load_checkpoint, save_checkpoint
from algos.system.paths import latest_checkpoint, list_checkpoints
from rlvr_env.testing import available_devices, build_char_tokenizer, build_tiny_model


def _tiny():
    model = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, scheduler


def _train_step(model, optimizer, scheduler):
    ids = torch.randint(4, 50, (2, 6))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_checkpoint_round_trip_restores_weights_optimizer_rng(tmp_path):
    model, optimizer, scheduler = _tiny()
    _train_step(model, optimizer, scheduler)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer, scheduler=scheduler, state={"position": 7})
    expected_draws = (random.random(), np.random.rand(), torch.rand(1))
    _train_step(model, optimizer, scheduler)
    expected_params = [p.detach().clone() for p in model.parameters()]

    fresh, fresh_opt, fresh_sched = _tiny()
    loaded = load_checkpoint(latest_checkpoint(tmp_path), model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    assert loaded == {"step": 1, "state": {"position": 7}}
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected_draws
    _train_step(fresh, fresh_opt, fresh_sched)
    for got, want in zip(fresh.parameters(), expected_params):
        assert torch.equal(got, want)


def test_only_complete_checkpoints_count_and_old_ones_are_pruned(tmp_path):
    model, optimizer, _ = _tiny()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model=model, optimizer=optimizer, keep_last=2)
    (tmp_path / ".checkpoint-4.tmp-123").mkdir()  # what a kill mid-write leaves behind
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]
    assert latest_checkpoint(tmp_path).name == "checkpoint-3"


def test_a_checkpoint_written_on_a_gpu_resumes_on_a_cpu_only_host(tmp_path, monkeypatch):
    import torch.serialization

    model, optimizer, scheduler = _tiny()
    _train_step(model, optimizer, scheduler)
    with monkeypatch.context() as patch:  # torch.save tags every storage as a GPU run's would be
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer, scheduler=scheduler)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only host, also where tests run on a GPU one
    with pytest.raises(RuntimeError, match="CUDA"):  # what load_checkpoint hit before it read onto the CPU
        torch.load(latest_checkpoint(tmp_path) / "rng-0.pt", weights_only=False)
    fresh, fresh_opt, fresh_sched = _tiny()
    assert load_checkpoint(latest_checkpoint(tmp_path), model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)["step"] == 1
    state = fresh_opt.state_dict()["state"][0]
    assert state["exp_avg"].device.type == "cpu" and torch.equal(state["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_checkpoints_keep_only_the_training_gpus_rng_state(tmp_path, monkeypatch):
    """Every visible GPU's state, restored by index, crashed a resume that sees fewer GPUs."""
    from algos.run import checkpoint

    states = {"cuda:1": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    restored = {}
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: states[str(device)].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.__setitem__(str(device), state))
    saved = checkpoint.rng_state(torch.device("cuda:1"))
    assert torch.equal(saved["cuda"], states["cuda:1"])
    checkpoint.set_rng_state(saved, torch.device("cuda:1"))
    assert list(restored) == ["cuda:1"] and torch.equal(restored["cuda:1"], states["cuda:1"])
    assert "cuda" not in checkpoint.rng_state(torch.device("cpu"))
    checkpoint.set_rng_state(saved, torch.device("cpu"))  # a GPU run resumed on the CPU: its GPU state is unused
    assert list(restored) == ["cuda:1"]


def test_pruning_never_deletes_the_new_checkpoint_and_clears_killed_writers_leftovers(tmp_path):
    model, optimizer, _ = _tiny()
    for step in (11, 12):  # another run's, numbered higher
        save_checkpoint(tmp_path, step, model=model, optimizer=optimizer, keep_last=2)
    dead_pid = 2**22 + 1  # above Linux's pid_max default: no such process
    (tmp_path / f".checkpoint-5.tmp-{dead_pid}").mkdir()
    (tmp_path / f".checkpoint-5.stale-{dead_pid}").mkdir()
    save_checkpoint(tmp_path, 3, model=model, optimizer=optimizer, keep_last=2)
    save_checkpoint(tmp_path, 6, model=model, optimizer=optimizer, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-3", "checkpoint-6", "checkpoint-11", "checkpoint-12"]
    assert not list(tmp_path.glob(".checkpoint-*"))


def test_completion_logprobs_match_full_logits_with_left_padding():
    from algos.model.policy import completion_logprobs, position_ids_from_mask

    model, _, _ = _tiny()
    ids = torch.randint(4, 50, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # row 0's prompt is left-padded by 2
    logp, entropy = completion_logprobs(model, ids, mask, prompt_width=4, chunk_size=3)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    full = torch.log_softmax(logits[:, 3:-1].float(), -1)
    torch.testing.assert_close(logp, full.gather(-1, ids[:, 4:].unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1))


def test_completion_logprobs_of_one_token_completions_need_no_completion_pass():
    """Every completion one token long (as the zero-weight micro-batch a rank without rows runs): each is predicted
    from its prompt's last state alone."""
    from algos.model.policy import completion_logprobs

    model, _, _ = _tiny()
    ids = torch.tensor([[5, 7, 9], [5, 7, 11], [6, 8, 12]])
    mask = torch.ones_like(ids)
    logp, _ = completion_logprobs(model, ids, mask, prompt_width=2)
    full = torch.log_softmax(model(input_ids=ids[:, :2]).logits[:, -1].float(), -1)
    torch.testing.assert_close(logp[:, 0], full.gather(-1, ids[:, 2:]).squeeze(-1))


def _ragged_group_batch(vocab: int = 50):
    """Two groups of three rows, interleaved, with left-padded prompts of two lengths and completions of 1-5 tokens
    (right padding) -> (ids, mask, prompt width)."""
    prompt_width = 6
    prompts = torch.randint(4, vocab, (2, prompt_width))
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :3] = 0  # the second prompt is shorter; two columns are padding in every row
    prompt_mask[:, :2] = 0
    order = [0, 1, 0, 1, 1, 0]  # groups need not be contiguous
    ids = torch.cat([prompts[order], torch.randint(4, vocab, (6, 5))], 1)
    mask = torch.cat([prompt_mask[order], torch.ones(6, 5, dtype=torch.long)], 1)
    for row, length in enumerate([5, 2, 1, 4, 3, 2]):  # completions end early: right padding
        mask[row, prompt_width + length :] = 0
    return ids, mask, prompt_width


@pytest.mark.parametrize("checkpointing, attention, window, decoder_rows", [
    (False, "sdpa", None, 4), (False, "eager", None, 4), (False, "sdpa", 8, 6), (True, "sdpa", None, 6),
], ids=["packed-sdpa", "packed-eager", "sliding-window-unpacked", "gradient-checkpointing"])
@pytest.mark.parametrize("device", available_devices())
def test_completion_logprobs_share_group_prompts_and_skip_padding_exactly(checkpointing, attention, window, decoder_rows,
                                                                         device):
    """Groups of identical (left-padded) prompts with ragged completions: log-probs, entropy and
    gradients equal a plain full forward's; positions after a completion's end are 0. The completions of a prompt are
    packed into as few decoder rows as fit the longest (SDPA's boolean mask, eager attention's additive one); a
    sliding window shorter than the rows keeps a row per completion. With gradient checkpointing
    (model.gradient_checkpointing) rows run whole and each layer is recomputed in backward."""
    from algos.model.policy import completion_logprobs, position_ids_from_mask

    torch.manual_seed(0)
    model = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=4).eval()
    model.config._attn_implementation = attention
    model.config.sliding_window = window
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layer_calls, batch_rows = [], []
    for layer in model.get_decoder().layers:
        # A pre-hook: torch stops a recomputation once it has what backward needs, before a layer's forward returns.
        layer.register_forward_pre_hook(lambda module, args: layer_calls.append(module))
    model.get_decoder().layers[0].register_forward_pre_hook(lambda module, args: batch_rows.append(args[0].shape[0]))
    ids, mask, prompt_width = _ragged_group_batch()
    model, ids, mask = model.to(device), ids.to(device), mask.to(device)
    valid = mask[:, prompt_width:].bool()

    logp, entropy = completion_logprobs(model, ids, mask, prompt_width, chunk_size=4)
    forward_calls = len(layer_calls)
    (logp * valid).sum().backward()
    # rows whole: one pass per layer, recomputed once in backward; shared prompts: a prompt pass and a completion pass
    assert (forward_calls, len(layer_calls) - forward_calls) == ((2, 2) if checkpointing else (4, 0))
    # Completions fed (each but its last token): 4, 1, 0, 3, 2, 1 tokens; prompt 0 has rows 0, 2, 5 and prompt 1 rows
    # 1, 3, 4, so 4 decoder rows of 4 tokens hold them: [0], [5], [3 + 1], [4].
    assert batch_rows[-1] == decoder_rows
    assert not any(m.training for m in model.modules())  # the layers' own flag was set for the call only: no dropout
    shared_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    full = torch.log_softmax(logits[:, prompt_width - 1 : -1].float(), -1)
    plain = full.gather(-1, ids[:, prompt_width:, None]).squeeze(-1)
    (plain * valid).sum().backward()
    torch.testing.assert_close(logp[valid], plain[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[valid], -(full.exp() * full).sum(-1)[valid], atol=1e-5, rtol=1e-5)
    assert (logp[~valid] == 0).all() and (entropy[~valid] == 0).all()
    for shared, param in zip(shared_grads, model.parameters()):
        torch.testing.assert_close(shared, param.grad, atol=1e-5, rtol=1e-4)



def test_the_attention_switches_apply_to_sdpa_models_alone_and_give_the_models_own_back():
    """training_attention swaps in the fp32 kernel for an SDPA model on a CPU only; materialized_masks hands an SDPA
    model's layers the causal mask as a tensor for rows without padding, where transformers passes None (what the
    compiled layers need, tested without compiling: attention.py's mutation run cannot trace); each gives the model
    its own implementation back after, and an eager model keeps its own throughout."""
    from algos.model.attention import FP32_GROUPED_SDPA, materialized_masks, training_attention

    torch.manual_seed(0)
    model = build_tiny_model(build_char_tokenizer(), hidden_size=48, num_layers=1, num_heads=4).eval()
    model.set_attn_implementation("sdpa")
    masks = []
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs["attention_mask"]), with_kwargs=True)
    ids = torch.randint(4, 40, (2, 6))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
        with materialized_masks(model):
            assert model.config._attn_implementation == "sdpa_materialized_mask"
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert masks[0] is None
    assert torch.equal(masks[1], torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 1, 6, 6))
    assert model.config._attn_implementation == "sdpa"
    with training_attention(model, torch.device("cpu")):
        assert model.config._attn_implementation == FP32_GROUPED_SDPA
    with training_attention(model, torch.device("cuda")):  # only the device's type is read
        assert model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("eager")
    with training_attention(model, torch.device("cpu")), materialized_masks(model):
        assert model.config._attn_implementation == "eager"


def skip_where_mutmut_wrapped_the_traced_attention() -> None:
    """attention.py's mutation run (tests/mutation/run.py) wraps the CPU's training attention, which the compiled
    layers trace, in mutmut's trampolines, which Dynamo cannot trace: skip there (compiled.py's run keeps the test)."""
    from algos.model import attention

    if hasattr(attention.fp32_grouped_sdpa_attention, "__wrapped__"):
        pytest.skip("mutmut wrapped the attention the compiled layers trace, and Dynamo cannot trace its trampolines")


@pytest.mark.parametrize("device", available_devices())
def test_compiled_layers_give_the_eager_logprobs_and_gradients_from_one_graph(device):
    """model.compile_layers (algos/model/compiled.py): the training forward runs rows whole through the decoder layers
    compiled by torch.compile, with the log-probs, entropy and gradients of the eager shared-prompt forward. Every
    layer, a batch of another width, and one without padding reuse one compiled graph (full graph, dynamic shapes);
    outside the training forward the layers run as they are (a cached decode compiles nothing). On CUDA through
    inductor's kernels; on a CPU through Dynamo's "eager" backend, which runs the captured graph (inductor's C++ build
    would cost CI ~30 s)."""
    from algos.model.compiled import compile_decoder_layers, compiled_layers, decoder_layers, has_compiled_layers
    from algos.model.policy import completion_logprobs

    skip_where_mutmut_wrapped_the_traced_attention()
    torch._dynamo.reset()
    compiled_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    def graphs() -> int:  # Dynamo's count (a backend can be called twice for one graph: inductor restarts its analysis)
        return torch._dynamo.utils.counters["stats"]["unique_graphs"] - compiled_before
    torch.manual_seed(0)
    # head_dim 12: a width equal to a fixed size would be specialised (duck sizing), and compiled once more
    model = build_tiny_model(build_char_tokenizer(), hidden_size=48, num_layers=3, num_heads=4).eval().to(device)
    model.set_attn_implementation("sdpa")
    ids, mask, prompt_width = _ragged_group_batch()
    ids, mask = ids.to(device), mask.to(device)
    valid = mask[:, prompt_width:].bool()

    def logprobs_and_grads(ids, mask):
        model.zero_grad()
        logp, entropy = completion_logprobs(model, ids, mask, prompt_width, chunk_size=4)
        (logp * mask[:, prompt_width:]).sum().backward()
        return logp, entropy, [p.grad.clone() for p in model.parameters()]

    eager = logprobs_and_grads(ids, mask)
    unpadded = [0, 0]  # two full rows of the first prompt: no padding once its padding columns are cut
    eager_unpadded = logprobs_and_grads(ids[unpadded], mask[unpadded])
    assert not has_compiled_layers(model)
    assert compile_decoder_layers(model, backend="inductor" if device == "cuda" else "eager") == 3
    assert has_compiled_layers(model)
    compiled = logprobs_and_grads(ids, mask)
    torch.testing.assert_close(compiled[0][valid], eager[0][valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled[1][valid], eager[1][valid], atol=1e-5, rtol=1e-5)
    assert (compiled[0][~valid] == 0).all()
    for got, expected in zip(compiled[2], eager[2]):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert graphs() == 1  # three layers, one graph

    wider_ids = torch.cat([ids, ids[:, -3:]], 1)  # three more completion columns
    wider_mask = torch.cat([mask, mask[:, -1:].expand(-1, 3)], 1)
    logprobs_and_grads(wider_ids, wider_mask)
    assert graphs() == 1  # dynamic shapes: no recompilation for another width
    # transformers passes SDPA no mask for rows without padding (is_causal), and Dynamo guards on None: the layers are
    # given the mask as a tensor still, or they would compile again (a whole step's time on a GPU)
    compiled_unpadded = logprobs_and_grads(ids[unpadded], mask[unpadded])
    assert graphs() == 1
    for got, expected in zip(compiled_unpadded, eager_unpadded):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(model))  # only inside the forward
    with torch.no_grad():
        model.generate(input_ids=ids[:, :prompt_width], attention_mask=mask[:, :prompt_width], max_new_tokens=3,
                       do_sample=False, pad_token_id=0)
    assert graphs() == 1  # decoding with a KV cache runs the layers as they are
    with compiled_layers(model):
        assert all(layer._compiled_call_impl is not None for layer in decoder_layers(model))
    owned = decoder_layers(model)[0]
    owned.compile(backend="eager")  # the model's owner compiled a layer: it gets that back after the forward
    theirs = owned._compiled_call_impl
    with compiled_layers(model):
        assert owned._compiled_call_impl is not theirs
    assert owned._compiled_call_impl is theirs
    torch._dynamo.reset()


@pytest.mark.parametrize("failure, reason", [
    ("backend", "RuntimeError: no C compiler here"), ("silent backend", "RuntimeError: "), ("graph break", "Unsupported: "),
])
def test_layers_that_fail_to_compile_run_eager_after_one_warning(failure, reason):
    """Where the backend cannot compile a layer (a GPU box without the C compiler Triton builds with, say) or Dynamo
    cannot trace it whole, that training forward finishes eager with the same log-probs, one warning names the
    failure, and later forwards run eager, the shared prompt's way, without another warning."""
    from algos.model.compiled import compile_decoder_layers, decoder_layers, has_compiled_layers
    from algos.model.policy import completion_logprobs

    skip_where_mutmut_wrapped_the_traced_attention()

    def failing_backend(graph, example_inputs):
        raise RuntimeError("no C compiler here\nmore detail" if failure == "backend" else "")

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_tiny_model(build_char_tokenizer(), hidden_size=48, num_layers=3, num_heads=4).eval()
    if failure == "graph break":  # a hook runs inside the compiled call: fullgraph makes its break an error
        decoder_layers(model)[1].register_forward_pre_hook(lambda module, args: torch._dynamo.graph_break())
    ids, mask, prompt_width = _ragged_group_batch()
    valid = mask[:, prompt_width:].bool()
    eager, _ = completion_logprobs(model, ids, mask, prompt_width, chunk_size=4)
    compile_decoder_layers(model, backend=failing_backend if failure != "graph break" else "eager")
    ending = r"\)$" if failure != "graph break" else ""  # Dynamo's own message runs on
    with pytest.warns(UserWarning, match=r"^model.compile_layers: compiling LlamaDecoderLayer failed, the training "
                                         r"forwards run eager from now on \(" + reason + ending):
        logp, _ = completion_logprobs(model, ids, mask, prompt_width, chunk_size=4)
    torch.testing.assert_close(logp[valid], eager[valid], atol=1e-5, rtol=1e-5)
    assert not has_compiled_layers(model)
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, _ = completion_logprobs(model, ids, mask, prompt_width, chunk_size=4)
    torch.testing.assert_close(again, eager, atol=0, rtol=0)  # the shared-prompt forward, as before compiling
    torch._dynamo.reset()


def test_compile_layers_needs_a_decoder_with_a_list_of_layers():
    from algos.model.compiled import compile_decoder_layers, has_compiled_layers

    class Headless(torch.nn.Module):
        def __init__(self, decoder: torch.nn.Module) -> None:
            super().__init__()
            self.decoder = decoder

        def get_decoder(self) -> torch.nn.Module:
            return self.decoder

    one_layer = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=1, num_heads=4)
    assert compile_decoder_layers(one_layer) == 1 and has_compiled_layers(one_layer)  # compiles at its first call
    held = weakref.ref(one_layer)
    del one_layer
    gc.collect()
    assert held() is None  # what compile_decoder_layers keeps does not keep the model alive
    for decoder in (torch.nn.Linear(2, 2), torch.nn.Module()):
        decoder.layers = torch.nn.ModuleList() if isinstance(decoder, torch.nn.Linear) else torch.nn.Linear(2, 2)
        with pytest.raises(TypeError, match=r"^Headless's decoder has no `layers` list to compile \(model.compile_layers\)$"):
            compile_decoder_layers(Headless(decoder))
    with pytest.raises(TypeError, match="Headless's decoder has no `layers` list"):
        compile_decoder_layers(Headless(torch.nn.Identity()))


def test_compile_layers_auto_compiles_one_cuda_process_without_recomputation():
    from algos.model.compiled import resolve_compile_layers

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_compile_layers("auto", cuda, world_size=1, gradient_checkpointing=False) == "on"
    assert resolve_compile_layers("auto", cpu, world_size=1, gradient_checkpointing=False) == "off"
    assert resolve_compile_layers("auto", cuda, world_size=2, gradient_checkpointing=False) == "off"
    assert resolve_compile_layers("auto", cuda, world_size=1, gradient_checkpointing=True) == "off"
    assert resolve_compile_layers("on", cpu, world_size=1, gradient_checkpointing=False) == "on"
    assert resolve_compile_layers("off", cuda, world_size=1, gradient_checkpointing=False) == "off"
    with pytest.raises(ValueError, match="model.compile_layers: 'on' runs in one process only, this run has 2"):
        resolve_compile_layers("on", cuda, world_size=2, gradient_checkpointing=False)


def test_a_cpu_training_forward_computes_attention_in_fp32_with_grouped_kv_heads(monkeypatch):
    """On a CPU an SDPA model's training forward runs fp32_grouped_sdpa_attention (algos/model/attention.py), even under
    bf16 autocast: every SDPA call gets fp32 query, keys and values outside autocast, the packed rows' call the grouped
    KV heads unrepeated; the model has SDPA back afterwards. Its log-probs and gradients equal transformers' SDPA's in
    fp32; in bf16 weights the output projection gets bf16, as it would from SDPA."""
    from algos.model.attention import FP32_GROUPED_SDPA
    from algos.model.policy import completion_logprobs

    torch.manual_seed(0)
    model = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=4).eval()
    model.set_attn_implementation("sdpa")
    ids, mask, width = _ragged_group_batch()
    valid = mask[:, width:].bool()

    def logprobs_and_grads():
        model.zero_grad()
        logp, _ = completion_logprobs(model, ids, mask, width)
        (logp * valid).sum().backward()
        return logp, [p.grad.clone() for p in model.parameters()]

    calls, seen = [], []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, **kwargs):
        calls.append(([t.dtype for t in (query, key, value)], torch.is_autocast_enabled("cpu"), key.shape[1],
                      kwargs.get("attn_mask") is not None, kwargs.get("enable_gqa", False)))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    hook = model.get_decoder().layers[0].register_forward_pre_hook(
        lambda module, args: seen.append(model.config._attn_implementation))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs_and_grads()
    hook.remove()
    assert set(seen) == {FP32_GROUPED_SDPA} and model.config._attn_implementation == "sdpa"
    assert calls and all(dtypes == [torch.float32] * 3 and not autocast for dtypes, autocast, *_ in calls)
    assert {(kv_heads, gqa) for *_, kv_heads, masked, gqa in calls if masked} == {(2, True)}  # 4 query heads

    ours, ours_grads = logprobs_and_grads()
    monkeypatch.setattr("algos.model.policy.training_attention", lambda *_: contextlib.nullcontext())
    rows = []
    hook = model.get_decoder().layers[0].register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    theirs, their_grads = logprobs_and_grads()
    hook.remove()
    assert rows == [2, 4]  # transformers' own SDPA packs the completions too: a pass of 2 prompts, one of 4 rows
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    for mine, other in zip(ours_grads, their_grads):
        torch.testing.assert_close(mine, other, atol=1e-6, rtol=1e-5)
    monkeypatch.undo()
    model.to(torch.bfloat16)
    half, _ = completion_logprobs(model, ids, mask, width)
    torch.testing.assert_close(half, theirs, atol=0.1, rtol=0.05)


def test_the_critic_trains_on_fp32_grouped_attention_and_a_checkpointed_policy_keeps_its_own():
    """PPO's critic forward takes the same CPU attention as the policy's log-probs; a policy with gradient checkpointing
    does not, since its layers are recomputed in backward, after the forward's context has given SDPA back."""
    from algos.model.attention import FP32_GROUPED_SDPA
    from algos.model.policy import completion_logprobs
    from algos.model.value import build_value_model

    torch.manual_seed(0)
    model = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=4).eval()
    model.set_attn_implementation("sdpa")
    ids, mask, width = _ragged_group_batch()
    seen = []
    for kind in ("head", "separate"):
        critic = build_value_model(model, kind)
        hook = critic.backbone.layers[0].register_forward_pre_hook(
            lambda module, args, config=critic.backbone.config: seen.append(config._attn_implementation))
        critic(ids, mask).sum().backward()
        hook.remove()
        assert seen.pop() == FP32_GROUPED_SDPA and critic.backbone.config._attn_implementation == "sdpa"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.get_decoder().layers[0].register_forward_pre_hook(
        lambda module, args: seen.append(model.config._attn_implementation))
    logp, _ = completion_logprobs(model, ids, mask, width)
    logp.sum().backward()
    assert set(seen) == {"sdpa"}  # the forward and its recomputation alike


@pytest.mark.parametrize("arch, logit_config", [
    ("Gemma2", {"final_logit_softcapping": 3.0, "head_dim": 8}),
    ("Granite", {"logits_scaling": 8.0}),
    ("Cohere", {"logit_scale": 0.0625}),
])
def test_completion_logprobs_apply_the_models_own_logit_transform(arch, logit_config, monkeypatch):
    """Gemma-2 soft-caps its logits, Granite and Cohere scale them: the trainer's log-probs (LM head on
    hidden states) must equal the model's own forward, which is what the rollout samples from."""
    import transformers

    from algos.core.logprobs import LogitTransform
    from algos.model import policy
    from algos.model.policy import check_lm_head, completion_logprobs, position_ids_from_mask

    config = getattr(transformers, f"{arch}Config")(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, **logit_config,
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    with torch.no_grad():  # logits of a trained model's size, where the soft cap bites
        model.get_output_embeddings().weight.mul_(40.0)
    ids = torch.randint(4, 40, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logp, _ = completion_logprobs(model, ids, mask, prompt_width=4)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    expected = torch.log_softmax(logits[:, 3:-1].float(), -1).gather(-1, ids[:, 4:, None]).squeeze(-1)
    torch.testing.assert_close(logp, expected, atol=1e-4, rtol=1e-4)
    check_lm_head(model)
    monkeypatch.setattr(policy, "lm_head_of", lambda model, vocab_size=None: (model.lm_head.weight, LogitTransform()))
    with pytest.raises(ValueError, match=f"{arch}ForCausalLM's logits differ from its LM head's output"):
        check_lm_head(model)  # a transform the trainer does not know is refused, not trained through

def test_nonfinite_gradients_skip_the_update_and_keep_weights():
    from algos.system.runtime import guarded_optimizer_step

    model, optimizer, _ = _tiny()
    before = [p.detach().clone() for p in model.parameters()]
    ids = torch.randint(4, 50, (2, 6))
    (model(input_ids=ids, labels=ids).loss * float("nan")).backward()
    outcome = guarded_optimizer_step(model, optimizer, max_grad_norm=1.0)
    assert not outcome.applied and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before)) and not optimizer.state
    model(input_ids=ids, labels=ids).loss.backward()
    assert guarded_optimizer_step(model, optimizer, max_grad_norm=1.0).applied
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_cuda_devices_resolve_to_the_indexed_name_model_parameters_report(monkeypatch):
    """torch.device("cuda") != torch.device("cuda:0"), the device a model's parameters report: an
    unindexed name made the rollout's env/model device check fail on every GPU run."""
    from algos.system.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="model.device = 'cuda:2', but torch sees 2 GPU"):
        resolve_device("cuda:2")


def test_a_gpu_device_on_a_host_without_one_is_a_config_error(monkeypatch):
    """torch's own error was an AssertionError ("Torch not compiled with CUDA enabled") from inside .to()."""
    from algos.system.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="model.device = 'cuda', but torch sees no GPU"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


def test_accuracy_counts_full_credit_only_as_task_is_success_does():
    """A reasoning-gym scorer's partial credit (0.65) was counted as a solved problem by the trainer's
    accuracy (threshold 0.5) while Task.is_success (curriculum, CompletionEnv) said unsolved. The trainer's
    accuracy is now RolloutResult.solved, which is rlvr_env.task.solved, which Task.is_success calls too."""
    from rlvr_env.task import solved

    graded = solved(torch.tensor([1.1, 0.75, 0.1]), {"correct": torch.tensor([1.0, 0.65, 0.0])})
    assert graded.float().tolist() == [1.0, 0.0, 0.0]
    plain = solved(torch.tensor([1.0, 0.9, 0.0]), {})
    assert plain.float().tolist() == [1.0, 0.0, 0.0]


def test_adamw_on_half_precision_weights_warns_and_names_the_fix():
    """bf16 weights updated by AdamW at lr 1e-6 mostly do not change: training looked normal and did not learn."""
    import warnings

    from algos.config import OptimConfig
    from algos.system.runtime import build_optimizer

    with pytest.warns(UserWarning, match=r"torch.bfloat16 weights .* model.dtype = float32 and model.autocast = bfloat16"):
        build_optimizer(torch.nn.Linear(4, 4).to(torch.bfloat16), OptimConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_optimizer(torch.nn.Linear(4, 4), OptimConfig())


def test_rows_stop_at_the_models_generation_config_eos_ids_too():
    """Qwen2.5-Instruct stops at <|im_end|> (its tokenizer's EOS) and <|endoftext|> (generation_config):
    model.generate and vllm stop at both, so the env must too, or the backends disagree on where rows end."""
    from algos.config import EvalConfig
    from algos.model.policy import stop_token_ids
    from algos.rollout import HFRollout, make_env

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2).eval()
    other_end = tokenizer.convert_tokens_to_ids("#")
    model.generation_config.eos_token_id = [other_end, tokenizer.eos_token_id, len(tokenizer) + 5]
    assert stop_token_ids(model, tokenizer) == sorted([tokenizer.eos_token_id, other_end])  # ids past the tokenizer dropped
    model.generation_config.eos_token_id = None
    assert stop_token_ids(model, tokenizer) == [tokenizer.eos_token_id]

    model.generation_config.eos_token_id = other_end
    with torch.no_grad():
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(tokenizer)))
        model.lm_head.bias[other_end] = 100.0  # the model's first token is its generation-config EOS
    config = EvalConfig()
    config.env.max_new_tokens, config.env.use_chat_template = 5, False
    env = make_env(config, tokenizer, num_envs=2, device=torch.device("cpu"), model=model)
    env.reset(seed=0)
    result = HFRollout(seed=0).generate(model, env)
    assert result.response_ids[:, 0].tolist() == [other_end] * 2
    assert result.response_mask.sum(-1).tolist() == [1, 1] and not result.truncated.any()


def test_float16_loss_scaling_unscales_before_clipping_and_backs_off_on_overflow():
    """fp16 autocast without loss scaling lets small gradients underflow to 0; with it, the step sees the
    true gradients (clipping and grad_norm unscaled), and an overflow skips the update and halves the scale."""
    from algos.config import ModelConfig
    from algos.system.runtime import grad_scaler, guarded_optimizer_step

    assert not grad_scaler(ModelConfig(autocast="bfloat16"), torch.device("cpu")).is_enabled()
    scaler = grad_scaler(ModelConfig(autocast="float16"), torch.device("cpu"))
    layer = torch.nn.Linear(2, 1, bias=False)
    layer.weight.data.fill_(1.0)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    loss = layer(torch.tensor([[3.0, 4.0]])).sum()  # gradient [3, 4], norm 5
    scaler.scale(loss).backward()
    assert layer.weight.grad.tolist() == [[3.0 * 65536, 4.0 * 65536]]
    outcome = guarded_optimizer_step(layer, optimizer, max_grad_norm=1.0, scaler=scaler)
    assert outcome.applied and outcome.grad_norm == pytest.approx(5.0)
    torch.testing.assert_close(layer.weight.data, torch.tensor([[1 - 0.1 * 0.6, 1 - 0.1 * 0.8]]))  # clipped to norm 1
    scale = scaler.get_scale()
    layer(torch.tensor([[3.0, 4.0]])).sum().mul(float("inf")).backward()
    before = layer.weight.data.clone()
    outcome = guarded_optimizer_step(layer, optimizer, max_grad_norm=1.0, scaler=scaler)
    assert not outcome.applied and torch.equal(layer.weight.data, before)
    assert scaler.get_scale() == scale / 2
    # every loss of a step non-finite, so nothing was backpropagated: skipped, and the scaler is left alone
    outcome = guarded_optimizer_step(layer, optimizer, max_grad_norm=1.0, loss_finite=False, scaler=scaler)
    assert not outcome.applied and scaler.get_scale() == scale / 2
    fresh = grad_scaler(ModelConfig(autocast="float16"), torch.device("cpu"))  # nothing scaled yet: a first step
    assert not guarded_optimizer_step(layer, optimizer, max_grad_norm=1.0, loss_finite=False, scaler=fresh).applied


def test_full_determinism_switches_torch_to_deterministic_kernels(monkeypatch):
    from algos.system.runtime import seed_everything

    for name in ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "ASCEND_LAUNCH_BLOCKING", "HCCL_DETERMINISTIC",
                 "FLASH_ATTENTION_DETERMINISTIC"):
        monkeypatch.delenv(name, raising=False)  # restored after the test, as the torch flags below are
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", torch.backends.cudnn.deterministic)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    try:
        seed_everything(3, full_determinism=True)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
        draw = torch.rand(1)
        seed_everything(3)
        assert torch.equal(torch.rand(1), draw)  # the same seeding either way
    finally:
        torch.use_deterministic_algorithms(False)


def test_every_way_the_trainers_write_weights_advances_the_version_vllm_copies_by(tmp_path):
    """VLLMRollout skips the copy while the parameters' version counters stand still; build_optimizer's AdamW is
    fused, whose kernel does not advance them, so guarded_optimizer_step does."""
    from algos.config import OptimConfig
    from algos.rollout import weights_version
    from algos.system.runtime import build_optimizer, guarded_optimizer_step

    model, _, _ = _tiny()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    assert all(group["fused"] for group in optimizer.param_groups)
    before = weights_version(model)
    model(input_ids=torch.randint(4, 50, (2, 6)), labels=torch.randint(4, 50, (2, 6))).loss.backward()
    assert guarded_optimizer_step(model, optimizer, max_grad_norm=1.0).applied
    after_step = weights_version(model)
    assert all(a != b for a, b in zip(after_step, before))
    save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer)
    load_checkpoint(latest_checkpoint(tmp_path), model=model, optimizer=optimizer)
    assert all(a != b for a, b in zip(weights_version(model), after_step))


def test_a_chat_template_asked_for_but_missing_is_said_not_silently_dropped():
    from algos.algorithms.grpo import GRPOConfig
    from algos.config import load_config
    from algos.rollout import make_env

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None  # as a base model's
    with pytest.warns(UserWarning, match="env.use_chat_template is true but the tokenizer has no chat template"):
        make_env(load_config(GRPOConfig), tokenizer, num_envs=2, device=torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_env(load_config(GRPOConfig, overrides=["--env.use_chat_template", "false"]), tokenizer, num_envs=2,
                 device=torch.device("cpu"))


