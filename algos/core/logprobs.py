"""Log-probabilities of taken tokens, and entropy, without a full B x T x V fp32 tensor.

Rows of hidden states (or logits) are processed `chunk_size` tokens at a time;
with gradients on, each chunk runs under activation checkpointing so its
V-wide logits are recomputed in the backward pass instead of being kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_SIZE = 256  # tokens per chunk: 256 x 49k vocab x 4 bytes ~ 50 MB per V-wide tensor


def _logprob_entropy(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, V] logits, [N] tokens -> ([N] log-prob of tokens, [N] entropy), in fp32."""
    logits = logits.float()
    if temperature != 1.0:  # a V-wide division per token otherwise
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    taken = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return taken, entropy


@dataclass(frozen=True)
class LogitTransform:
    """What a causal LM applies to hidden @ W.T before its softmax: multiply by ``scale`` (Cohere's
    logit_scale, Granite's 1 / logits_scaling), then soft-cap to ``softcap * tanh(x / softcap)``
    (Gemma-2's final_logit_softcapping). The default is the identity, as in most models."""

    scale: float = 1.0
    softcap: float | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _hidden_chunk(
    hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, temperature: float, transform: LogitTransform
):
    """[N, H] hidden, [V, H] weight, [N] tokens -> ([N] log-prob, [N] entropy)."""
    return _logprob_entropy(transform(hidden @ weight.T), tokens, temperature)


def _logits_chunk(logits: torch.Tensor, tokens: torch.Tensor, temperature: float):
    """[N, V] logits, [N] tokens -> ([N] log-prob, [N] entropy)."""
    return _logprob_entropy(logits, tokens, temperature)


def _chunked(fn, inputs: torch.Tensor, extra: tuple, tokens: torch.Tensor, temperature: float, chunk_size: int):
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    batch_shape = tokens.shape
    flat_in = inputs.reshape(-1, inputs.shape[-1])
    flat_tokens = tokens.reshape(-1)
    needs_grad = torch.is_grad_enabled() and (flat_in.requires_grad or any(t.requires_grad for t in extra))
    logps, entropies = [], []
    for start in range(0, flat_tokens.numel(), chunk_size):
        args = (flat_in[start : start + chunk_size], *extra, flat_tokens[start : start + chunk_size], temperature)
        if needs_grad:
            logp, ent = checkpoint(fn, *args, use_reentrant=False)
        else:
            logp, ent = fn(*args)
        logps.append(logp)
        entropies.append(ent)
    return torch.cat(logps).reshape(batch_shape), torch.cat(entropies).reshape(batch_shape)


def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    transform: LogitTransform = LogitTransform(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T, H] hidden, [V, H] lm_head weight, [B, T] tokens -> ([B, T] log pi(token), [B, T] entropy), fp32;
    the logits are ``transform(hidden @ weight.T) / temperature``."""
    if hidden.shape[:-1] != tokens.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and tokens {tuple(tokens.shape)} disagree on [B, T]")
    return _chunked(partial(_hidden_chunk, transform=transform), hidden, (lm_head_weight,), tokens, temperature, chunk_size)


def logprobs_from_logits(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T, V] logits (any dtype), [B, T] tokens -> ([B, T] log pi(token), [B, T] entropy), fp32 per chunk."""
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree on [B, T]")
    return _chunked(_logits_chunk, logits, (), tokens, temperature, chunk_size)
