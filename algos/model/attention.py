"""Attention kernels chosen for a CPU, registered with transformers (AttentionInterface, AttentionMaskInterface) and
switched on around the calls they were measured faster in; the model's own attention is given back after.

- Decoding (``decoding_attention``): under a padding mask, transformers' SDPA (and eager attention) copy grouped-query
  attention's KV heads to every query head at each layer and step; ``grouped_sdpa_attention`` hands them to SDPA as
  they are (``enable_gqa``).
- Training forwards (``training_attention``): the same, computed in fp32. Under bf16 autocast torch's CPU flash
  attention runs bf16, whose backward is several times slower than fp32's there.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

# transformers' attention registry names of the two functions below
GROUPED_SDPA = "rlvr_grouped_sdpa"
FP32_GROUPED_SDPA = "rlvr_grouped_sdpa_fp32"


def grouped_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except that under a mask the grouped KV heads of grouped-query attention go to
    SDPA as they are (``enable_gqa``): transformers repeats them to every query head there, a copy of the whole KV
    cache per layer and decode step. query [B, H, q, D], key/value [B, H_kv, k, D] -> ([B, q, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None or any(kwargs.get(name) is not None for name in ("position_bias", "cache", "softcap")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def fp32_grouped_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """grouped_sdpa_attention in fp32 whatever the autocast, its output in ``value``'s dtype (what the output
    projection takes; under autocast it casts to bf16 anyway). On a 2-core Xeon with AMX, one packed training call of
    SmolLM2 (6 rows, 63 queries over 113 keys, boolean mask), forward and backward: 21.7 ms as transformers runs it
    under bf16 autocast (KV heads repeated, bf16 flash attention), 5.5 ms here."""
    with torch.autocast(query.device.type, enabled=False):
        out, _ = grouped_sdpa_attention(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
    return out.to(value.dtype), None


@functools.cache
def registered(name: str) -> str:
    """``name`` (GROUPED_SDPA or FP32_GROUPED_SDPA), registered once with transformers: its function, and SDPA's mask
    (boolean, and a custom [B, 1, q, k] mask passes through unchanged, as SDPA's does)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    functions = {GROUPED_SDPA: grouped_sdpa_attention, FP32_GROUPED_SDPA: fp32_grouped_sdpa_attention}
    AttentionInterface.register(name, functions[name])
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def takes_sdpa_masks(implementation: str | None) -> bool:
    """Whether a model's attention implementation takes SDPA's masks (boolean, a custom 4-D one unchanged)."""
    return implementation in ("sdpa", GROUPED_SDPA, FP32_GROUPED_SDPA)


def _materialized_sdpa_mask(*args, allow_is_causal_skip: bool = True, **kwargs):
    """transformers' SDPA mask, never None: rows without padding get their causal mask as a tensor too."""
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, allow_is_causal_skip=False, **kwargs)


@functools.cache
def _registered_materialized(name: str) -> str:
    """The attention implementation ``name`` registered again, under its name + "_materialized_mask", with
    _materialized_sdpa_mask: the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    AttentionInterface.register(f"{name}_materialized_mask", ALL_ATTENTION_FUNCTIONS[name])
    AttentionMaskInterface.register(f"{name}_materialized_mask", _materialized_sdpa_mask)
    return f"{name}_materialized_mask"


def materialized_masks(model) -> contextlib.AbstractContextManager[None]:
    """While inside, a model whose attention takes SDPA's masks gets its causal mask as a tensor always. transformers
    passes None instead for rows without padding (SDPA's ``is_causal``), and a compiled layer (algos/model/compiled.py)
    that has seen both compiles twice: Dynamo guards on the mask being None, and a GPU compile of a layer's forward and
    backward takes seconds to minutes."""
    current = getattr(model.config, "_attn_implementation", None)
    applies = takes_sdpa_masks(current) and hasattr(model, "set_attn_implementation")
    return _switched_attention(model, _registered_materialized(current) if applies else None)


def _cpu_attention(model, device: torch.device, name: str) -> contextlib.AbstractContextManager[None]:
    """Run ``model`` with the attention registered as ``name`` while inside, if it is an SDPA model on a CPU."""
    current = getattr(model.config, "_attn_implementation", None)
    applies = device.type == "cpu" and current == "sdpa" and hasattr(model, "set_attn_implementation")
    return _switched_attention(model, registered(name) if applies else None)


@contextlib.contextmanager
def _switched_attention(model, name: str | None) -> Iterator[None]:
    """``model`` runs the attention implementation registered as ``name`` while inside, its own after (None: its own
    throughout)."""
    if name is None:
        yield
        return
    current = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(current)


def decoding_attention(model, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On a CPU, an SDPA model decodes with grouped_sdpa_attention. A rollout of SmolLM2-135M (64 x 64 tokens, fp32,
    2-core Xeon) took 9.9 s instead of 11.5 s (eager, and SDPA alike)."""
    return _cpu_attention(model, device, GROUPED_SDPA)


def recomputes_in_backward(model) -> bool:
    """Whether ``model``'s layers will be recomputed in backward: gradient checkpointing on, and a gradient wanted."""
    return getattr(model, "is_gradient_checkpointing", False) and torch.is_grad_enabled()


def training_attention(model, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On a CPU, an SDPA model's training forwards (the policy's log-probs, the critic's values) use
    fp32_grouped_sdpa_attention; not where the layers are recomputed in backward (recomputes_in_backward), after
    this context: the recomputation would run other kernels than the forward did."""
    if recomputes_in_backward(model):
        return contextlib.nullcontext()
    return _cpu_attention(model, device, FP32_GROUPED_SDPA)
