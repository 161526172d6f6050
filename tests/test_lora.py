"""LoRA through PEFT ([lora] section): only the adapters train, the KL reference is the base model with the adapter
disabled (no second copy), checkpoints hold the adapter in PEFT's format, `rlvr export --merge` writes the merged
model, a resume is bitwise, and bad input names its key."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from algos.algorithms.grpo import GRPOConfig, GRPOTrainer, train
from algos.config import load_config
from algos.model.loading import load_policy
from algos.model.lora import adapter_disabled, apply_lora, has_lora, merged_copy, merged_state_dict
from algos.model.policy import completion_logprobs
from algos.run.reporting import SilentLogger
from algos.system.paths import latest_checkpoint
from rlvr_env.testing import biased_addition_model, saved_tiny_model

TASK = '{"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}=", "format_weight": 0.0}'


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=2, num_heads=2)


@pytest.fixture(scope="module")
def sft_model_dir(tmp_path_factory):
    """A tiny model that samples right sums now and then, so GRPO has a signal to train the adapter on."""
    return biased_addition_model(tmp_path_factory.mktemp("sft") / "model", steps=150)


def lora_overrides(model_dir, output_dir, **extra):
    base = {
        "model.path": str(model_dir), "model.autocast": "null", "env.kwargs": TASK, "env.max_new_tokens": "4",
        "env.use_chat_template": "false", "env.eval_size": "8", "optim.lr": "1e-2", "run.output_dir": str(output_dir),
        "run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "4",
        "rollout.group_size": "4", "loss.micro_batch_size": "8", "grpo.beta": "0.04", "lora.r": "4", "lora.alpha": "8",
        "run.steps": "2", "run.save_every": "1", "run.keep_last": "4",
    }
    return {**base, **extra}


def lora_model(tiny_model_dir, **lora):
    """The tiny model with LoRA (r 4 on every linear layer) and its B matrices set non-zero (a trained adapter)."""
    model, tokenizer = load_policy(tiny_model_dir, dtype=torch.float32, device="cpu")
    config = load_config(GRPOConfig, overrides={"lora.r": "4", **{f"lora.{k}": v for k, v in lora.items()}}).lora
    model = apply_lora(model, config)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    return model, tokenizer


def test_only_the_adapters_train_and_the_reference_is_the_base_model(tiny_model_dir):
    base, _ = load_policy(tiny_model_dir, dtype=torch.float32, device="cpu")
    model, tokenizer = lora_model(tiny_model_dir)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    ids = torch.tensor([tokenizer.encode("3+4=7")] * 2)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        adapted = completion_logprobs(model, ids, mask, 4)[0]
        with adapter_disabled(model):
            reference = completion_logprobs(model, ids, mask, 4)[0]
        plain = completion_logprobs(base, ids, mask, 4)[0]
    assert torch.equal(reference, plain)  # the adapter disabled is the base model, bit for bit
    assert not torch.allclose(adapted, plain)  # and the adapter does change the policy
    with adapter_disabled(base):  # a model without LoRA is itself
        assert torch.equal(completion_logprobs(base, ids, mask, 4)[0], plain)


def test_the_merged_weights_are_pefts_merge_and_decode_as_the_adapted_policy(tiny_model_dir):
    model, tokenizer = lora_model(tiny_model_dir)
    merged = merged_copy(model)
    assert not has_lora(merged) and has_lora(model)
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    ours = merged_state_dict(model)
    assert ours.keys() == merged.state_dict().keys()
    assert all(torch.equal(ours[name], tensor) for name, tensor in merged.state_dict().items())
    ids = torch.tensor([tokenizer.encode("3+4=7")])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)  # W + BA vs W x + B(A x)
    assert any("lora_" in name for name, _ in model.named_parameters())  # the policy keeps its adapter


def test_compiled_layers_under_lora_are_one_graph_with_the_eager_logprobs_and_gradients(tiny_model_dir):
    """model.compile_layers with a frozen embedding: the first layer's input does not require grad as the others' do;
    it is made to, so every layer shares one graph (two before: twice the compile time, minutes on a GPU at 0.5B)."""
    from algos.model.compiled import compile_decoder_layers

    torch._dynamo.reset()
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    model, tokenizer = lora_model(tiny_model_dir)
    model.set_attn_implementation("sdpa")
    ids = torch.tensor([tokenizer.encode("3+4=7"), tokenizer.encode("12+5=17")[:5]])
    mask = torch.ones_like(ids)

    def logprobs_and_grads():
        model.zero_grad()
        logp, _ = completion_logprobs(model, ids, mask, 3, chunk_size=4)
        logp.sum().backward()
        return logp, {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}

    eager = logprobs_and_grads()
    compile_decoder_layers(model, backend="eager")
    compiled = logprobs_and_grads()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before == 1
    torch.testing.assert_close(compiled[0], eager[0], atol=1e-5, rtol=1e-5)
    assert compiled[1].keys() == eager[1].keys() and all("lora_" in name for name in eager[1])
    # rows whole against a shared prompt: float rounding apart (1.5e-5 of a matrix's norm alone, 4e-4 after the rest
    # of the suite on the 2-core Xeon); a gradient missing its path through the first layer's input would be O(1)
    for name, grad in eager[1].items():
        assert (compiled[1][name] - grad).norm() <= 2e-3 * grad.norm(), name
    torch._dynamo.reset()


def test_bad_lora_settings_name_the_key(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"config lora.r: must be >= 0 \(0 = no LoRA\), got -1"):
        load_config(GRPOConfig, overrides={"lora.r": "-1"}).validate()
    with pytest.raises(ValueError, match=r"config lora.dropout: must be in \[0, 1\), got 1.0"):
        load_config(GRPOConfig, overrides={"lora.dropout": "1"}).validate()
    model, _ = load_policy(tiny_model_dir, dtype=torch.float32, device="cpu")
    config = load_config(GRPOConfig, overrides={"lora.r": "4", "lora.target_modules": "[qkv_proj]"}).lora
    with pytest.raises(ValueError, match=r"config lora.target_modules: \['qkv_proj'\] matches no module of "
                                         r"LlamaForCausalLM; its linear modules are down_proj, gate_proj, k_proj, "
                                         r"o_proj, q_proj, up_proj, v_proj"):
        apply_lora(model, config)
    saved = load_config(GRPOConfig, overrides={"lora.r": "4", "lora.modules_to_save": "[score]"}).lora
    with pytest.raises(ValueError, match=r"config lora.modules_to_save: 'score' is no module of LlamaForCausalLM"):
        apply_lora(model, saved)
    warm = lora_overrides(tiny_model_dir, tmp_path / "warm", **{"warm_start.steps": "2"})
    with pytest.raises(ValueError, match=r"^config lora.r: a LoRA run's KL reference is its base model \(the adapter "
                                         r"disabled\), which a warm start would leave behind: set warm_start.steps = 0, "
                                         r"or the KL coefficient to 0, or lora.r = 0$"):
        GRPOTrainer(load_config(GRPOConfig, overrides=warm))
    assert not (tmp_path / "warm").exists()  # refused before the run directory is made


def test_a_lora_run_trains_the_adapter_saves_it_in_pefts_format_and_exports_it_merged(sft_model_dir, tmp_path):
    summary = train(load_config(GRPOConfig, overrides=lora_overrides(sft_model_dir, tmp_path / "run")))
    saved = latest_checkpoint(tmp_path / "run") / "model"
    assert (saved / "adapter_config.json").is_file() and not (saved / "model.safetensors").exists()
    adapter = load_file(saved / "adapter_model.safetensors")
    assert adapter and all("lora_" in name for name in adapter)
    assert any(tensor.abs().sum() > 0 for name, tensor in adapter.items() if "lora_B" in name)  # it trained
    assert json.loads((saved / "adapter_config.json").read_text())["r"] == 4

    base, tokenizer = load_policy(sft_model_dir, dtype=torch.float32, device="cpu")
    untouched = copy.deepcopy(base)
    peft_loaded = PeftModel.from_pretrained(base, saved)  # a user's own PEFT code loads it
    ours, _ = load_policy(tmp_path / "run", dtype=torch.float32, device="cpu")  # a run directory loads merged
    ids = torch.tensor([tokenizer.encode("3+4=")])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, peft_loaded(ids).logits, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(ours(ids).logits, untouched(ids).logits)

    out = tmp_path / "merged"
    export = subprocess.run([sys.executable, "-m", "rlvr_cli", "export", "--merge", str(tmp_path / "run"), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-2000:]
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, ours(ids).logits, atol=1e-5, rtol=1e-5)
    again = subprocess.run([sys.executable, "-m", "rlvr_cli", "export", "--merge", str(tmp_path / "run"), str(out)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert summary["eval_accuracy_after"] >= 0


def test_a_resumed_lora_run_ends_bitwise_where_the_whole_run_does(sft_model_dir, tmp_path):
    config = lora_overrides(sft_model_dir, tmp_path / "run", **{"run.steps": "3"})
    train(load_config(GRPOConfig, overrides=config))
    adapter = tmp_path / "run" / "checkpoint-3" / "model" / "adapter_model.safetensors"
    want = load_file(adapter)
    for step in (2, 3):  # as if killed after checkpoint-1
        shutil.rmtree(tmp_path / "run" / f"checkpoint-{step}")
    train(load_config(GRPOConfig, overrides=config), resume=True)
    got = load_file(adapter)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert any(tensor.abs().sum() > 0 for name, tensor in want.items() if "lora_B" in name)


def test_a_lora_run_of_rank_one_says_what_trains_and_how_its_forwards_run(tiny_model_dir, tmp_path, caplog):
    overrides = lora_overrides(tiny_model_dir, tmp_path / "run", **{"lora.r": "1", "lora.alpha": "2"})
    with caplog.at_level("INFO", logger="rlvr"):
        trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides))
    model = trainer.run.model
    assert has_lora(model) and trainer.run.ref_model is model  # the reference: the adapter disabled, no copy
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < trainable < total
    assert (f"LoRA r=1 alpha=2 on all-linear: {trainable:,} trainable parameters of {total:,} "
            f"({trainable / total:.2%})") in caplog.messages
    assert "training forwards: decoder layers eager (model.compile_layers off)" in caplog.messages


def test_gradient_checkpointing_under_lora_trains_the_adapter_it_trains_without(sft_model_dir, tmp_path):
    """LoRA with model.gradient_checkpointing (how a 7B model fits one GPU): the frozen embeddings' output needs no
    gradient, yet every recomputed layer must still pass the adapters theirs."""
    adapters = {}
    for checkpointing in ("false", "true"):
        overrides = lora_overrides(sft_model_dir, tmp_path / checkpointing,
                                   **{"model.gradient_checkpointing": checkpointing})
        trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides))
        assert trainer.model.is_gradient_checkpointing == (checkpointing == "true")
        trainer.train()
        adapters[checkpointing] = load_file(latest_checkpoint(tmp_path / checkpointing) / "model"
                                            / "adapter_model.safetensors")
    assert any(tensor.abs().sum() > 0 for name, tensor in adapters["true"].items() if "lora_B" in name)
    assert adapters["true"].keys() == adapters["false"].keys()
    for name, tensor in adapters["false"].items():
        torch.testing.assert_close(adapters["true"][name], tensor, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("sampling", [{"greedy": True}, {}])
def test_the_static_engine_samples_the_lora_policy_from_a_merged_copy_and_follows_its_steps(tiny_model_dir, sampling):
    from test_static_rollout import reset_env

    from algos.rollout import HFRollout, row_seeds
    from algos.rollout.static import StaticRollout

    model, tokenizer = lora_model(tiny_model_dir)
    engine = StaticRollout(check_every=3)
    for step in range(2):
        seeds = row_seeds(step, range(12))
        peft_sampled = HFRollout().generate(model, reset_env(tokenizer), seeds=seeds, **sampling)
        merged_sampled = engine.generate(model, reset_env(tokenizer), seeds=seeds, **sampling)
        assert torch.equal(merged_sampled.response_ids, peft_sampled.response_ids)
        torch.testing.assert_close(merged_sampled.logprobs, peft_sampled.logprobs, atol=1e-4, rtol=0)
        decoder = engine._decoder
        assert not has_lora(decoder) and not any("lora_" in name for name, _ in decoder.named_parameters())
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
        ids = torch.tensor([tokenizer.encode("3+4=7")])
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()  # the adapter moves; the next round must sample the new weights
    assert engine._decoder is decoder  # refreshed in place, not rebuilt


def test_one_grpo_step_with_lora_on_the_static_engine(sft_model_dir, tmp_path):
    overrides = lora_overrides(sft_model_dir, tmp_path / "run", **{"rollout.backend": "static", "run.steps": "1"})
    trainer = GRPOTrainer(load_config(GRPOConfig, overrides=overrides))
    metrics = trainer.train_step(1, SilentLogger())
    assert metrics["rollout_logp_abs_diff"] < 1e-4  # the merged copy samples what the adapted policy scores
    assert trainer.rollout_correction == "tis"


@pytest.mark.parametrize("value_model", ["head", "separate"])
def test_ppo_with_lora_trains_the_adapter_and_its_critic(sft_model_dir, tmp_path, value_model):
    """The "head" critic is a value head on the policy's adapted backbone (the head trains in full, the backbone
    through the shared adapter); "separate" copies the adapted policy, so the critic has its own adapter."""
    from test_ppo import small_overrides

    from algos.algorithms import ppo

    config = load_config(ppo.PPOConfig, overrides=small_overrides(
        sft_model_dir, tmp_path / "run", **{"lora.r": "4", "lora.alpha": "8", "ppo.value_model": value_model,
                                             "ppo.kl_coef": "0.05", "run.steps": "2"}))
    trainer = ppo.PPOTrainer(config)
    assert trainer.ref_model is trainer.policy  # the reference is the policy with its adapter disabled
    frozen = {name: p.detach().clone() for name, p in trainer.policy.named_parameters() if not p.requires_grad}
    trainable = [name for name, p in trainer.critic.named_parameters() if p.requires_grad]
    assert trainable and (value_model == "head" or all("lora_" in name or name.startswith("head.")
                                                       for name in trainable)), trainable
    trainer.train()
    assert all(torch.equal(p, frozen[name]) for name, p in trainer.policy.named_parameters() if name in frozen)
    assert (latest_checkpoint(tmp_path / "run") / "model" / "adapter_config.json").is_file()


@pytest.mark.parametrize("online", [False, True])
def test_dpo_with_lora_trains_the_adapter_against_the_base_model(sft_model_dir, tmp_path, online):
    from test_dpo import PAIRS, write_rows

    from algos.algorithms.dpo import PRESETS, DPOConfig, DPOTrainer

    pairs = write_rows(tmp_path / "prefs.jsonl", PAIRS)
    settings = {"model.path": str(sft_model_dir), "model.autocast": "null", "dpo.pairs_per_step": "5",
                "loss.micro_batch_size": "4", "optim.lr": "1e-2", "run.output_dir": str(tmp_path / "run"),
                "run.progress": "false", "run.tensorboard": "false", "run.plots": "false", "run.steps": "2",
                "env.use_chat_template": "false", "env.kwargs": TASK, "env.max_new_tokens": "4", "env.eval_size": "4",
                "lora.r": "4", "lora.alpha": "8"}
    settings.update({"dpo.dataset": "null", "rollout.prompts_per_step": "4", "rollout.group_size": "4"} if online
                    else {"dpo.dataset": str(pairs)})
    trainer = DPOTrainer(load_config(DPOConfig, preset=PRESETS["online"] if online else None, overrides=settings))
    assert trainer.run.ref_model is trainer.model
    frozen = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if not p.requires_grad}
    trainer.train()
    assert all(torch.equal(p, frozen[name]) for name, p in trainer.model.named_parameters() if name in frozen)
    adapter = load_file(latest_checkpoint(tmp_path / "run") / "model" / "adapter_model.safetensors")
    assert any(tensor.abs().sum() > 0 for name, tensor in adapter.items() if "lora_B" in name)
