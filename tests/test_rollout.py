"""HFRollout: KV-cache stepping of TokenVectorEnv matches model.generate and the policy's own log-probs."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest
import torch
import yaml

from algos.config import require
from algos.model.attention import GROUPED_SDPA, registered
from algos.model.policy import position_ids_from_mask
from algos.rollout import HFRollout, Rollout, RolloutBackend, SamplingParams, row_seeds, sample_tokens
from algos.rollout.base import filter_logits, inverse_cdf_sample
from rlvr_env import TokenVectorEnv
from rlvr_env.task import Problem
from rlvr_env.tasks.arithmetic import ArithmeticTask
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


class RaggedArithmetic(ArithmeticTask):
    """Arithmetic with prompts of different lengths, so left padding is exercised."""

    def problem(self, index: int, seed: int) -> Problem:
        base = super().problem(index, seed)
        return Problem("Q" * (index % 7) + base.prompt, base.answer, base.metadata)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, seed=3).eval()


def make_env(tokenizer, num_envs=6, max_new_tokens=12):
    return TokenVectorEnv(RaggedArithmetic(), tokenizer, num_envs=num_envs, max_new_tokens=max_new_tokens)


def reference_logprobs(model, env, rollout, temperature):
    """Log-probs of the taken tokens from one full forward pass over prompt + response (no cache)."""
    ids = torch.cat([env.prompt_ids, rollout.response_ids], 1)
    mask = torch.cat([env.prompt_mask, rollout.response_mask], 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    width = env.prompt_width
    logits = logits[:, width - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, rollout.response_ids[..., None]).squeeze(-1) * rollout.response_mask


def test_greedy_rollout_matches_model_generate(model, tokenizer):
    env = make_env(tokenizer)
    env.reset(seed=0, options={"problem_indices": [0, 1, 2, 3, 4, 5]})
    assert len(set(env.prompt_mask.sum(-1).tolist())) > 1  # prompts really are ragged
    prompt_ids, prompt_mask = env.prompt_ids.clone(), env.prompt_mask.clone()
    rollout = HFRollout().generate(model, env, greedy=True)
    expected = model.generate(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        max_new_tokens=env.max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )[:, prompt_ids.shape[1] :]
    assert isinstance(rollout, Rollout) and isinstance(HFRollout(), RolloutBackend)
    for row in range(env.num_envs):
        length = int(rollout.response_mask[row].sum())
        assert rollout.response_ids[row, :length].tolist() == expected[row, :length].tolist()
    assert rollout.completions == tokenizer.batch_decode(
        [r[: int(m.sum()) - int(t)] for r, m, t in zip(rollout.response_ids, rollout.response_mask, ~rollout.truncated)],
        skip_special_tokens=True,
    )


def test_sampling_logprobs_equal_the_policy_logprobs(model, tokenizer):
    env = make_env(tokenizer, num_envs=8)
    env.reset(seed=1, options={"group_size": 4})
    rollout = HFRollout(temperature=0.7, seed=5).generate(model, env)
    expected = reference_logprobs(model, env, rollout, temperature=0.7)
    assert rollout.logprobs.shape == rollout.response_ids.shape
    torch.testing.assert_close(rollout.logprobs, expected, atol=1e-4, rtol=1e-4)
    assert (rollout.logprobs[rollout.response_mask == 0] == 0).all()


def test_prompts_prefill_once_per_group_and_finished_rows_leave_the_cache(model, tokenizer):
    # Every digit ends a row, so rows finish at different steps and the cache shrinks.
    digits = [tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    env = TokenVectorEnv(RaggedArithmetic(), tokenizer, num_envs=16, max_new_tokens=24, stop_token_ids=digits)
    env.reset(seed=3, options={"group_size": 4})
    rows_per_forward = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: rows_per_forward.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        rollout = HFRollout(seed=1).generate(model, env)
    finally:
        hook.remove()
    assert rows_per_forward[0] == 4  # one prefill row per prompt
    assert max(rows_per_forward[1:]) <= 16 and min(rows_per_forward[1:]) < 16  # finished rows were dropped
    lengths = rollout.response_mask.sum(-1)
    assert len(set(lengths.tolist())) > 1
    # Sharing the prefill and dropping rows changes nothing a row computes.
    torch.testing.assert_close(rollout.logprobs, reference_logprobs(model, env, rollout, 1.0), atol=1e-4, rtol=1e-4)


def test_seeded_sampling_is_reproducible_and_seeds_differ(model, tokenizer):
    def sample(seed):
        env = make_env(tokenizer, num_envs=8)
        env.reset(seed=2, options={"group_size": 8})
        return HFRollout(seed=seed).generate(model, env).response_ids

    first, again, other = sample(11), sample(11), sample(12)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert len({tuple(row.tolist()) for row in first}) > 1  # one prompt, several different samples


def test_a_cpu_rollout_decodes_with_grouped_sdpa_and_gives_sdpa_back(model, tokenizer):
    """grouped_sdpa_attention decodes faster on a CPU; what it samples is what an SDPA forward scores (the logprobs
    check of test_prompts_prefill_once_per_group... runs through it too), and the model keeps SDPA afterwards."""
    model.set_attn_implementation("sdpa")
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(module.config._attn_implementation))
    env = make_env(tokenizer, num_envs=2, max_new_tokens=3)
    env.reset(seed=0)
    try:
        HFRollout(seed=0).generate(model, env)
    finally:
        hook.remove()
    assert seen and set(seen) == {GROUPED_SDPA}
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["grouped-query", "multi-head"])
def test_grouped_sdpa_attention_equals_eager_on_a_left_padded_cached_decode(kv_heads):
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 50, (3, 8))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding, as the env's prompts
    mask[2, :1] = 0

    def decode(implementation):
        model.set_attn_implementation(implementation)
        cache, positions = DynamicCache(config=config), position_ids_from_mask(mask)
        with torch.no_grad():
            logits = [model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache).logits[:, -1]]
            step_mask, position = mask, positions[:, -1:]
            for _ in range(3):
                token = logits[-1].argmax(-1, keepdim=True)
                step_mask, position = torch.cat([step_mask, torch.ones_like(token)], 1), position + 1
                logits.append(model(input_ids=token, attention_mask=step_mask, position_ids=position,
                                    past_key_values=cache).logits[:, -1])
        return torch.stack(logits)

    torch.testing.assert_close(decode(registered(GROUPED_SDPA)), decode("eager"), atol=1e-5, rtol=1e-5)


def test_rollout_leaves_train_mode_as_it_was(model, tokenizer):
    env = make_env(tokenizer, num_envs=2, max_new_tokens=3)
    env.reset(seed=0)
    model.train()
    HFRollout(seed=0).generate(model, env)
    assert model.training
    model.eval()


def test_env_must_be_freshly_reset(model, tokenizer):
    env = make_env(tokenizer, num_envs=2, max_new_tokens=3)
    with pytest.raises(RuntimeError, match="reset"):
        HFRollout().generate(model, env)
    env.reset(seed=0)
    HFRollout(seed=0).generate(model, env)
    with pytest.raises(RuntimeError, match="reset"):
        HFRollout().generate(model, env)


def test_bad_sampling_params_are_named():
    with pytest.raises(ValueError, match="top_p"):
        HFRollout(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-1)


def test_filter_logits_top_k_and_top_p_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = filter_logits(logits, top_k=2, top_p=1.0)
    assert torch.isinf(top2[0, 2:]).all() and torch.isfinite(top2[0, :2]).all()
    # Nucleus 0.8: 0.5 + 0.3 reach it, so the 0.15 and 0.05 tokens go.
    nucleus = filter_logits(logits, top_k=0, top_p=0.8)
    assert torch.isfinite(nucleus[0, :2]).all() and torch.isinf(nucleus[0, 2:]).all()
    # A nucleus smaller than the top token keeps the top token only.
    assert torch.isfinite(filter_logits(logits, 0, 0.1)).tolist() == [[True, False, False, False]]


def test_inverse_cdf_sampling_draws_each_token_at_its_probability():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(20_000, 1)
    uniforms = torch.rand(len(probs), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tokens = inverse_cdf_sample(probs, uniforms)
    frequency = torch.bincount(tokens, minlength=6).double() / len(tokens)
    # zero-probability tokens never (first and last included); the others within 4 standard errors (~0.014)
    assert frequency[[0, 2, 5]].tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(frequency[[1, 3, 4]], torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), atol=0.014, rtol=0)
    # u's extremes: 0 takes the first token with mass, the largest u below 1 the last one
    extremes = torch.tensor([0.0, 1.0 - 2**-24], dtype=torch.float64)
    assert inverse_cdf_sample(torch.tensor([[0.0, 0.25, 0.75, 0.0]]).repeat(2, 1), extremes).tolist() == [1, 2]


def test_row_seeds_make_each_rows_samples_independent_of_how_the_batch_is_split(model, tokenizer):
    """A row's tokens depend on its seed alone: the whole batch, or its halves generated apart (two ranks), agree."""
    seeds = row_seeds(7, range(4))
    assert seeds == row_seeds(7, range(4)) and len(set(seeds)) == 4 and row_seeds(8, range(4)) != seeds
    assert row_seeds(7, range(2, 4)) == seeds[2:]
    backend = HFRollout()

    def completions(problem_indices, row_seed_list):
        env = make_env(tokenizer, num_envs=2 * len(problem_indices))
        env.reset(seed=0, options={"group_size": 2, "problem_indices": problem_indices})
        result = backend.generate(model, env, seeds=row_seed_list)
        return [ids[mask.bool()].tolist() for ids, mask in zip(result.response_ids, result.response_mask)]

    whole = completions([3, 5], seeds)
    assert whole == completions([3], seeds[:2]) + completions([5], seeds[2:])
    assert len({tuple(row) for row in whole}) > 1  # the rows really were sampled
    with pytest.raises(ValueError, match="one per env row, got 3 for 4 rows"):
        completions([3, 5], seeds[:3])


def test_sample_tokens_logprob_is_renormalised_over_the_kept_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    tokens, logprobs = sample_tokens(logits, SamplingParams(top_k=2, greedy=True))
    assert tokens.tolist() == [0]
    assert math.isclose(logprobs.item(), math.log(0.5 / 0.8), rel_tol=1e-5)



def test_padded_embedding_rows_are_never_sampled_and_log_probs_agree(tokenizer):
    """A model whose embedding table is padded past the tokenizer (Qwen2.5: 151,936 rows for 151,665
    tokens) with all the mass on the padding rows: the rollout samples only the tokenizer's ids, and
    its log-probs equal the trainer's over the same ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from algos.model.policy import completion_logprobs

    torch.manual_seed(0)
    vocab = len(tokenizer)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab + 28, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    with torch.no_grad():
        model.lm_head.weight[vocab:] *= 100  # the padding rows would win almost every draw
    env = make_env(tokenizer, num_envs=8)
    env.reset(seed=0, options={"group_size": 2})
    rollout = HFRollout(seed=0).generate(model, env)  # before: ValueError "not token ids in [0, 100)"
    assert rollout.response_ids.max().item() < vocab
    ids = torch.cat([env.prompt_ids, rollout.response_ids], 1)
    mask = torch.cat([env.prompt_mask, rollout.response_mask], 1)
    with torch.no_grad():
        trained, _ = completion_logprobs(model, ids, mask, env.prompt_width, vocab_size=vocab)
    torch.testing.assert_close(trained, rollout.logprobs, atol=1e-5, rtol=1e-5)

@pytest.mark.realmodel
def test_hf_rollout_matches_generate_on_smollm():
    from algos.model.loading import load_policy

    try:
        # fp32: the rollout decodes with grouped_sdpa_attention on a CPU, model.generate with SDPA; in bf16 weights the two
        # kernels' rounding (logits up to 0.4 apart) flips near-tied greedy tokens, in fp32 they agree to 5e-5
        model, tokenizer = load_policy("default", dtype="float32", device="cpu")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    env = TokenVectorEnv(ArithmeticTask(), tokenizer, num_envs=4, max_new_tokens=10)
    env.reset(seed=0)
    prompt_ids, prompt_mask = env.prompt_ids.clone(), env.prompt_mask.clone()
    rollout = HFRollout().generate(model, env, greedy=True)
    expected = model.generate(
        input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=10, do_sample=False
    )[:, prompt_ids.shape[1] :]
    for row in range(4):
        length = int(rollout.response_mask[row].sum())
        assert rollout.response_ids[row, :length].tolist() == expected[row, :length].tolist()


def test_the_trainers_vllm_engine_leaves_the_gpu_to_the_trainer_and_samples_in_its_dtype(monkeypatch):
    """vllm's own defaults took 92% of the GPU the trainer shares and sampled bf16 beside an fp32 trainer."""
    from algos.algorithms.grpo import GRPOConfig
    from algos.config import load_config
    from algos.rollout import make_rollout_backend, vllm

    built = []
    monkeypatch.setattr(vllm, "VLLMRollout", lambda path, **kwargs: built.append(kwargs))
    monkeypatch.setattr("algos.model.loading.resolve_model_path", lambda path: path)

    def engine(*overrides):
        make_rollout_backend(load_config(GRPOConfig, overrides=["--rollout.backend", "vllm", *overrides]))
        return built.pop()

    fp32 = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "dtype": "float32", "gpu_memory_utilization": 0.3}
    assert engine("--model.autocast", "null") == fp32
    with pytest.raises(ValueError, match="model.autocast 'auto' must be resolved first"):
        engine()  # setup_run resolves it to what this machine computes fast before building the backend
    assert engine("--model.autocast", "bfloat16")["dtype"] == "bfloat16"
    custom = engine("--vllm.dtype", "float16", "--vllm.gpu_memory_utilization", "0.5",
                    "--vllm.engine_kwargs", "{max_model_len: 1024, enforce_eager: true}")
    assert custom["dtype"] == "float16" and custom["gpu_memory_utilization"] == 0.5
    assert custom["max_model_len"] == 1024 and custom["enforce_eager"] is True
    for overrides, key in [
        (["--vllm.engine_kwargs", "{dtype: half}"], "vllm.engine_kwargs"),
        (["--vllm.gpu_memory_utilization", "0"], "vllm.gpu_memory_utilization"),
        (["--vllm.dtype", "fp8"], "vllm.dtype"),
    ]:
        with pytest.raises(ValueError, match=key):
            load_config(GRPOConfig, overrides=overrides)


def test_rows_longer_than_the_models_context_are_refused_by_name(tokenizer):
    """Past max_position_embeddings a learned position table raised IndexError inside torch.embedding (a GPT-2 eval
    crashed; in training, after as many steps as it took to sample a long row), and RoPE models degraded silently."""
    model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2)
    model.config.max_position_embeddings = 24
    env = TokenVectorEnv(ArithmeticTask(), tokenizer, num_envs=2, max_new_tokens=16)
    env.reset(seed=0)
    assert env.prompt_width + 16 > 24
    with pytest.raises(ValueError, match=r"\+ env.max_new_tokens \(16\) exceed the model's max_position_embeddings \(24\)"):
        HFRollout().generate(model, env)


def test_rope_scaling_stretches_the_context_the_length_check_allows(tokenizer):
    """Qwen2.5 keeps max_position_embeddings at 32,768 and documents YaRN factor 4 for 131,072 tokens."""
    model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2)
    model.config.max_position_embeddings = 24
    model.config.rope_scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 24}
    env = TokenVectorEnv(ArithmeticTask(), tokenizer, num_envs=2, max_new_tokens=16)
    env.reset(seed=0)
    assert 24 < env.prompt_width + 16 <= 96
    assert isinstance(HFRollout().generate(model, env, greedy=True), Rollout)


def test_a_registered_engine_is_what_rollout_backend_names(monkeypatch):
    """A new engine is one registration: config, the run's checks and the rollout correction read ROLLOUT_ENGINES."""
    from algos.algorithms.grpo import GRPOConfig
    from algos.config import load_config
    from algos.rollout import ROLLOUT_ENGINES, RolloutEngine, make_rollout_backend
    from algos.rollout import engines as environment

    built = []
    engine = RolloutEngine(lambda config, sampling, multiturn: built.append((sampling, multiturn)) or "backend",
                           own_weights=True, requires="a_module_nobody_installed", install="pip install it")
    monkeypatch.setitem(ROLLOUT_ENGINES, "mine", engine)
    config = load_config(GRPOConfig, overrides=["--rollout.backend", "mine", "--rollout.temperature", "0.5"])
    assert make_rollout_backend(config) == "backend"
    assert built == [({"temperature": 0.5, "top_p": 1.0, "top_k": 0}, False)]
    with pytest.raises(ValueError, match="rollout.backend = 'mine' needs a_module_nobody_installed: pip install it"):
        ROLLOUT_ENGINES["mine"].check_available("mine")
    multiturn = load_config(GRPOConfig, overrides=["--rollout.backend", "mine", "--env.id", "rlvr/CalculatorArithmetic-v0"])
    with pytest.raises(ValueError, match="multi-turn task, whose episodes only 'hf', 'static', 'vllm' play"):
        make_rollout_backend(multiturn)
    with pytest.raises(ValueError, match="unknown rollout.backend 'nope': choose one of 'hf', 'static', 'vllm', 'mine'"):
        make_rollout_backend(load_config(GRPOConfig, overrides=["--rollout.backend", "nope"]))
    assert environment.ROLLOUT_ENGINES["vllm"].own_weights and not environment.ROLLOUT_ENGINES["hf"].own_weights


@dataclass
class BeamEngineConfig:
    """A third-party engine's own keys: the config's [beams] section, defined outside algos/config.py."""
    width: int = 1  # beams kept per row (1: plain sampling)
    stop_text: str = "###"

    def validate(self) -> None:
        require(self.width >= 1, "beams.width", f"must be >= 1, got {self.width}")


@pytest.fixture
def beam_engine():
    """A toy engine "beams" registered with its section as any engine is; what it was built with, listed."""
    from algos.config import ENGINE_SECTIONS
    from algos.rollout import ROLLOUT_ENGINES, RolloutEngine

    built = []
    ROLLOUT_ENGINES.register("beams", RolloutEngine(lambda config, sampling, multiturn: built.append(config) or "backend",
                                                    section=BeamEngineConfig))
    yield built
    del ROLLOUT_ENGINES["beams"], ENGINE_SECTIONS["beams"]


def test_a_registered_engine_brings_its_own_section(beam_engine, tmp_path, capsys):
    """An engine's keys are a section of their own ([beams]), parsed, validated by name, listed by --help, saved in
    config.yaml and checked on --resume, with no edit to algos/config.py."""
    from algos.algorithms.grpo import GRPOConfig
    from algos.config import load_config, save_config
    from algos.rollout import make_rollout_backend
    from algos.run.checkpoint import CONFIG_FILE
    from algos.run.directory import check_resumable
    from rlvr_cli import main

    (tmp_path / "run.toml").write_text('[rollout]\nbackend = "beams"\n\n[beams]\nstop_text = "12"\n')
    config = load_config(GRPOConfig, tmp_path / "run.toml", overrides=["--beams.width", "4", "--run.steps", "3"])
    assert config.engine_sections["beams"] == BeamEngineConfig(width=4, stop_text="12")
    assert config.engine_sections["vllm"].gpu_memory_utilization == 0.3  # the other engines' at their defaults
    assert make_rollout_backend(config) == "backend" and beam_engine == [config]
    assert load_config(GRPOConfig, overrides=["--beams.stop_text", "12"]).engine_sections["beams"].stop_text == "12"
    with pytest.raises(ValueError, match="config beams.width: must be >= 1, got 0"):
        load_config(GRPOConfig, overrides=["--beams.width", "0"])
    with pytest.raises(ValueError, match=r"unknown config key 'beams.widht' \(did you mean beams.width\?"):
        load_config(GRPOConfig, overrides=["--beams.widht", "2"])
    with pytest.raises(ValueError, match=r"unknown config key 'width' \(did you mean beams.width\?"):
        load_config(GRPOConfig, overrides=["--width", "2"])  # never a bare key: no engine makes one ambiguous

    with pytest.raises(SystemExit):
        main(["train", "--algo", "grpo", "--help"])
    assert re.search(r"^beams:\n  width +int +1\n  stop_text +str +\"###\"$", capsys.readouterr().out, re.M)

    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    save_config(config, checkpoint / CONFIG_FILE)
    assert yaml.safe_load((checkpoint / CONFIG_FILE).read_text())["beams"] == {"width": 4, "stop_text": "12"}
    assert load_config(GRPOConfig, checkpoint / CONFIG_FILE) == config
    check_resumable(config, checkpoint)
    wider = load_config(GRPOConfig, checkpoint / CONFIG_FILE, overrides=["--beams.width", "8"])
    with pytest.raises(ValueError, match="beams.width: 4 -> 8"):
        check_resumable(wider, checkpoint)
    # a run saved before the engine was registered did not sample with it: its keys read as given
    saved = yaml.safe_load((checkpoint / CONFIG_FILE).read_text())
    del saved["beams"]
    saved["rollout"]["backend"] = "hf"
    (checkpoint / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    check_resumable(wider, checkpoint)


def test_every_built_in_engine_keeps_the_whole_protocol():
    """generate and sync_weights: the run may hand any engine the policy's new weights the same way."""
    from algos.rollout import MultiTurnHFRollout, ScriptedRollout, StaticRollout, VLLMRollout

    for engine in (HFRollout, MultiTurnHFRollout, ScriptedRollout, StaticRollout, VLLMRollout):
        assert callable(engine.generate) and callable(engine.sync_weights), engine
    assert isinstance(ScriptedRollout(lambda problem, row, round_index: ""), RolloutBackend)
    assert isinstance(StaticRollout(), RolloutBackend)


def test_weights_seen_tells_a_changed_or_other_model_from_the_one_copied():
    """The one record behind both engines that keep their own weights (static, vllm): which model, at which version."""
    from algos.rollout.base import WeightsSeen

    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    seen = WeightsSeen()
    assert not seen.is_model(model) and not seen.matches(model)
    seen.record(model)
    assert seen.is_model(model) and seen.matches(model) and not seen.is_model(other) and not seen.matches(other)
    with torch.no_grad():
        model.weight.add_(1.0)  # an optimizer step, a checkpoint load: an in-place write
    assert seen.is_model(model) and not seen.matches(model)
    seen.record(model)
    assert seen.matches(model)
