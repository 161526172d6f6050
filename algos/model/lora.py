"""LoRA through PEFT: the policy trains low-rank adapters, its reference is the same module with them disabled.

``apply_lora`` injects PEFT's LoRA layers into the transformers model in place (``get_peft_model``) and returns that
same model: everything above (the training forward, the engines, checkpoints) keeps handling a transformers causal
LM whose only trainable parameters are the adapters'. Its ``PeftModel`` rides along on the model (not as a
submodule, so no state dict sees it twice) for what only PEFT does: disabling the adapter (the KL and DPO
references, never a second copy of the weights), saving the adapter in PEFT's format, and merging.

An engine that keeps its own weights (the static engine) samples from a plain copy with W + scale * B @ A merged in
(``merged_copy``, refreshed by ``merged_state_dict``), so no decode step runs LoRA kernels.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

PEFT_INSTALL = "pip install 'peft>=0.17,<0.22'"
ADAPTER = "default"  # PEFT's name of the one adapter a run trains
_PEFT_MODEL = "rlvr_peft_model"  # the attribute on the policy that holds its PeftModel


def _peft():
    try:
        import peft
    except ModuleNotFoundError as error:
        if error.name != "peft":
            raise
        raise ModuleNotFoundError(f"config lora.r > 0 trains LoRA adapters with PEFT, which is not installed: "
                                  f"{PEFT_INSTALL}") from None
    return peft


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The last name of every Linear module of ``model`` but its LM head: what lora.target_modules can name."""
    head = model.get_output_embeddings()
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and module is not head})


def apply_lora(model: torch.nn.Module, lora: Any) -> torch.nn.Module:
    """Inject LoRA adapters (``lora``: the config's [lora] section, r > 0) into ``model`` in place; only they train
    (and ``modules_to_save``). Returns ``model``. A ``target_modules`` that matches nothing is refused, naming the
    model's linear modules."""
    peft = _peft()
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [name for name in lora.modules_to_save if name not in names]
    if missing:
        raise ValueError(f"config lora.modules_to_save: {missing[0]!r} is no module of {type(model).__name__}")
    target = lora.target_modules
    peft_config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=target,
                                  modules_to_save=list(lora.modules_to_save) or None, task_type="CAUSAL_LM")
    try:
        peft_model = peft.get_peft_model(model, peft_config)
    except ValueError as error:
        if "not found in the base model" not in str(error) and "did not match" not in str(error):
            raise
        raise ValueError(f"config lora.target_modules: {target!r} matches no module of {type(model).__name__}; its "
                         f"linear modules are {', '.join(linear_module_names(model))} (or 'all-linear')") from None
    policy = peft_model.base_model.model
    assert policy is model  # PEFT injects in place: the transformers model is the policy
    object.__setattr__(policy, _PEFT_MODEL, peft_model)  # not a submodule: its weights are the policy's
    return policy


def peft_model_of(model: torch.nn.Module):
    """The PeftModel around ``model``, or None when ``model`` has no LoRA adapters."""
    return model.__dict__.get(_PEFT_MODEL)


def has_lora(model: torch.nn.Module | None) -> bool:
    return model is not None and peft_model_of(model) is not None


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[None]:
    """``model`` as its base model inside the block (a LoRA policy's reference); a model without LoRA as it is."""
    peft_model = peft_model_of(model)
    with peft_model.disable_adapter() if peft_model is not None else contextlib.nullcontext():
        yield


def _plain_name(name: str) -> str | None:
    """A LoRA policy's state-dict key -> the plain model's key (None: an adapter weight or a saved module's copy)."""
    if ".lora_" in name or ".original_module." in name:
        return None
    return name.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", ".")


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A LoRA policy's weights with the adapter merged in (W + scale * B @ A; the trained copy of each saved module),
    under the plain model's names, computed apart: the policy's own weights are not touched."""
    from peft.tuners.lora import LoraLayer

    merged = {}
    for name, tensor in model.state_dict().items():
        plain = _plain_name(name)
        if plain is not None:
            merged[plain] = tensor
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            weight = module.get_base_layer().weight
            merged[f"{name}.weight"] = weight + module.get_delta_weight(ADAPTER).to(weight.dtype)
    return merged


def merged_copy(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A plain transformers model (no LoRA layers) holding ``model``'s merged weights, in ``dtype`` if given."""
    peft_model = copy.deepcopy(peft_model_of(model))
    plain = peft_model.merge_and_unload()
    plain.__dict__.pop(_PEFT_MODEL, None)
    return plain.to(dtype) if dtype is not None else plain


def save_adapter(model: torch.nn.Module, directory, state_dict: dict[str, torch.Tensor]) -> None:
    """Write a LoRA policy's adapter to ``directory`` in PEFT's format (adapter_config.json,
    adapter_model.safetensors), from ``state_dict`` (the policy's full state under its own names, e.g. gathered from
    FSDP2 shards), so ``PeftModel.from_pretrained(base, directory)`` loads it."""
    peft_model = peft_model_of(model)
    prefixed = {f"base_model.model.{name}": tensor for name, tensor in state_dict.items()}
    peft_model.save_pretrained(directory, state_dict=prefixed, safe_serialization=True)


def load_merged(base: torch.nn.Module, adapter_dir) -> torch.nn.Module:
    """``base`` (a transformers model) with the PEFT adapter in ``adapter_dir`` merged in: a plain model."""
    peft = _peft()
    return peft.PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
