"""Log-probabilities of taken tokens, and entropy, without a full B x T x V fp32 tensor.

Rows of hidden states (or logits) are processed `chunk_size` tokens at a time.
From hidden states, one autograd function projects each chunk through the LM
head into reused buffers; backward reuses the chunks' logits kept from forward
up to `keep_bytes` and recomputes the rest; from logits, each chunk runs under
activation checkpointing. Beyond that budget no V-wide tensor is kept for
backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_SIZE = 256  # tokens per chunk: 256 x 49k vocab x 4 bytes ~ 50 MB per V-wide tensor
# Forward's chunk logits kept for backward, which otherwise recomputes them: a quarter of the LM head's matmuls. 256 MiB
# holds a CPU micro-batch of SmolLM2 (8 rows x 64 tokens x 49k vocab in bf16 or fp32); longer ones recompute the rest.
DEFAULT_KEEP_BYTES = 256 * 2**20


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


def _check_options(temperature: float, chunk_size: int) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


class _LinearLogprobs(torch.autograd.Function):
    """[N, H] hidden, [V, H] weight, [N] tokens -> ([N] log-prob, [N] entropy) of softmax(transform(hidden @ weight.T)
    / temperature), chunk by chunk through [chunk, V] buffers reused by every chunk. Kept for backward: hidden and
    weight (in the matmul dtype, cast once), two floats per row, and the first chunks' raw logits up to ``keep_bytes``
    (bitwise what a recomputation gives). Backward recomputes the other chunks' logits, writes their gradient in place,
    and accumulates the weight's gradient in one [V, H] tensor: no [V, H] tensor is allocated per chunk (each fresh
    allocation that large is page-faulted in again, which dominated a CPU update)."""

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature: float, transform: LogitTransform, chunk_size: int,
                keep_bytes: int):
        matmul_dtype = _matmul_dtype(hidden, weight)
        ctx.set_materialize_grads(False)  # an unused entropy's gradient stays None, and its terms are skipped
        with torch.autocast(hidden.device.type, enabled=False):
            chunks = _Chunks(hidden, weight, temperature, transform, chunk_size, matmul_dtype, for_backward=False,
                             keep_bytes=keep_bytes)
            taken = torch.empty(tokens.shape, dtype=chunks.dtype, device=hidden.device)
            lse, entropy = torch.empty_like(taken), torch.empty_like(taken)
            for rows, logits, probs in chunks:
                lse[rows], entropy[rows] = chunks.softmax(logits, probs)
                taken[rows] = logits.gather(1, tokens[rows, None]).squeeze(1) - lse[rows]
        ctx.save_for_backward(chunks.hidden, chunks.weight, tokens, lse, entropy, *chunks.kept)
        ctx.options = temperature, transform, chunk_size, matmul_dtype, hidden.dtype, weight.dtype
        return taken, entropy

    @staticmethod
    def backward(ctx, grad_taken, grad_entropy):
        hidden, weight, tokens, lse, entropy, *kept = ctx.saved_tensors
        temperature, transform, chunk_size, matmul_dtype, hidden_dtype, weight_dtype = ctx.options
        want_hidden, want_weight = ctx.needs_input_grad[:2]
        if grad_taken is None and grad_entropy is None or not (want_hidden or want_weight):
            return None, None, None, None, None, None, None
        with torch.autocast(hidden.device.type, enabled=False):
            chunks = _Chunks(hidden, weight, temperature, transform, chunk_size, matmul_dtype, for_backward=True,
                             kept=kept)
            grad_hidden = torch.empty(hidden.shape, dtype=hidden_dtype, device=hidden.device) if want_hidden else None
            grad_weight = torch.zeros(weight.shape, dtype=chunks.dtype, device=weight.device) if want_weight else None
            for rows, logits, probs in chunks:
                torch.sub(logits, lse[rows, None], out=probs).exp_()
                # d taken / d logits = onehot - p;  d entropy / d logits = -p (log p + entropy), log p = logits - lse.
                grad = logits  # overwritten in place: the chunk's logits are not needed again
                if grad_entropy is None:
                    grad.copy_(probs).mul_(-grad_taken[rows, None])
                else:
                    grad.sub_((lse[rows] - entropy[rows])[:, None]).mul_(grad_entropy[rows, None])
                    if grad_taken is not None:
                        grad.add_(grad_taken[rows, None])
                    grad.mul_(probs).neg_()
                if grad_taken is not None:
                    grad.scatter_add_(1, tokens[rows, None], grad_taken[rows, None])
                chunks.through_transform(grad)
                chunks.backward_matmuls(rows, grad, grad_hidden, grad_weight)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def _matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the LM head's matmuls run in: autocast's where it is on (as a plain forward would), else the weight's."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


class _Chunks:
    """Iterates (rows, logits, probs) over ``hidden``'s rows, ``chunk_size`` at a time: ``logits`` holds
    transform(hidden[rows] @ weight.T) / temperature in fp32 (fp64 for fp64 matmuls), ``probs`` a same-shape
    buffer; both are views of buffers allocated once. Forward appends to ``kept`` each chunk's raw logits
    (hidden @ weight.T in the matmul dtype) while they fit ``keep_bytes``; backward takes ``kept`` in their place.
    ``for_backward`` adds what backward's steps need: a soft-capping transform's tanh for ``through_transform``, and
    a low-precision weight-gradient buffer."""

    def __init__(self, hidden, weight, temperature, transform, chunk_size, matmul_dtype, for_backward: bool,
                 keep_bytes: int = 0, kept: list[torch.Tensor] = ()):
        self.hidden, self.weight = hidden.to(matmul_dtype), weight.to(matmul_dtype)  # each cast once, not per chunk
        self.keep_bytes, self.kept = keep_bytes, list(kept)
        self.temperature, self.transform, self.chunk_size = temperature, transform, chunk_size
        width = (min(chunk_size, hidden.shape[0]), weight.shape[0])
        self.dtype = torch.promote_types(matmul_dtype, torch.float32)
        self.logits = torch.empty(width, dtype=self.dtype, device=hidden.device)
        self.probs = torch.empty_like(self.logits)
        low = matmul_dtype != self.dtype
        self.low = torch.empty(width, dtype=matmul_dtype, device=hidden.device) if low else None
        self.tanh = torch.empty_like(self.logits) if for_backward and transform.softcap else None
        backward_low = for_backward and low
        self.weight_product = torch.empty(weight.shape, dtype=matmul_dtype, device=weight.device) if backward_low else None

    def __iter__(self):
        for start in range(0, self.hidden.shape[0], self.chunk_size):
            rows = slice(start, min(start + self.chunk_size, self.hidden.shape[0]))
            count = rows.stop - rows.start
            logits, probs = self.logits[:count], self.probs[:count]
            self._logits(start // self.chunk_size, rows, logits)
            yield rows, logits, probs

    def _logits(self, index: int, rows: slice, logits: torch.Tensor) -> None:
        raw = logits if self.low is None else self.low[: logits.shape[0]]
        if index < len(self.kept):  # backward: forward's
            raw = self.kept[index]
        else:
            # Forward keeps a prefix of the chunks (backward finds chunk i at kept[i]): from the first that does not
            # fit the budget, none, not even a shorter last one that would.
            if index == len(self.kept) and sum(t.nbytes for t in self.kept) + raw.nbytes <= self.keep_bytes:
                raw = torch.empty_like(raw)
                self.kept.append(raw)
            torch.mm(self.hidden[rows], self.weight.T, out=raw)
        if raw is not logits:
            logits.copy_(raw)
        scale, softcap = self.transform.scale, self.transform.softcap
        if scale != 1.0:
            logits.mul_(scale)
        if softcap:
            logits.div_(softcap).tanh_()
            if self.tanh is not None:
                self.tanh[: logits.shape[0]].copy_(logits)
            logits.mul_(softcap)
        if self.temperature != 1.0:
            logits.div_(self.temperature)

    def softmax(self, logits: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[n, V] logits -> ([n] log-sum-exp, [n] entropy); ``probs`` is left holding the softmax."""
        top = logits.amax(1, keepdim=True)
        torch.sub(logits, top, out=probs).exp_()
        total = probs.sum(1, keepdim=True)
        probs.div_(total)
        lse = (top + total.log()).squeeze(1)
        expected_logit = torch.bmm(probs.unsqueeze(1), logits.unsqueeze(2)).view(-1)  # sum_v p_v logit_v, no [n, V] product
        return lse, lse - expected_logit

    def through_transform(self, grad: torch.Tensor) -> None:
        """d/d logits -> d/d (hidden @ weight.T), in place."""
        if self.temperature != 1.0:
            grad.div_(self.temperature)
        if self.transform.softcap:
            tanh = self.tanh[: grad.shape[0]]
            grad.mul_(tanh.square_().neg_().add_(1.0))
        if self.transform.scale != 1.0:
            grad.mul_(self.transform.scale)

    def backward_matmuls(self, rows: slice, grad: torch.Tensor, grad_hidden, grad_weight) -> None:
        """grad_hidden[rows] = grad @ weight; grad_weight += grad.T @ hidden[rows] (accumulated in fp32 at least)."""
        if self.low is not None:
            grad = self.low[: grad.shape[0]].copy_(grad)
        if grad_hidden is not None:
            grad_hidden[rows] = grad @ self.weight
        if grad_weight is not None:
            if self.weight_product is None:
                grad_weight.addmm_(grad.T, self.hidden[rows])
            else:
                grad_weight.add_(torch.mm(grad.T, self.hidden[rows], out=self.weight_product))


def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    transform: LogitTransform = LogitTransform(),
    keep_bytes: int = DEFAULT_KEEP_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T, H] hidden, [V, H] lm_head weight, [B, T] tokens -> ([B, T] log pi(token), [B, T] entropy), fp32;
    the logits are ``transform(hidden @ weight.T) / temperature``, ``chunk_size`` rows of them at a time, the first
    chunks' kept for backward up to ``keep_bytes`` (0: all recomputed, no V-wide tensor kept)."""
    if hidden.shape[:-1] != tokens.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and tokens {tuple(tokens.shape)} disagree on [B, T]")
    _check_options(temperature, chunk_size)
    if tokens.numel() == 0:
        empty = torch.zeros(tokens.shape, dtype=torch.float32, device=hidden.device)
        return empty, empty.clone()
    flat = hidden.reshape(-1, hidden.shape[-1])
    if not (torch.is_grad_enabled() and (hidden.requires_grad or lm_head_weight.requires_grad)):
        keep_bytes = 0  # no backward to keep them for
    taken, entropy = _LinearLogprobs.apply(flat, lm_head_weight, tokens.reshape(-1), temperature, transform, chunk_size,
                                           keep_bytes)
    return taken.view(tokens.shape), entropy.view(tokens.shape)


def logprobs_from_logits(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T, V] logits (any dtype), [B, T] tokens -> ([B, T] log pi(token), [B, T] entropy), fp32 per chunk;
    with a gradient wanted, each chunk is recomputed in backward instead of keeping its fp32 softmax."""
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree on [B, T]")
    _check_options(temperature, chunk_size)
    flat_logits, flat_tokens = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    logps, entropies = [], []
    for start in range(0, flat_tokens.numel(), chunk_size):
        args = (flat_logits[start : start + chunk_size], flat_tokens[start : start + chunk_size], temperature)
        logp, entropy = checkpoint(_logprob_entropy, *args, use_reentrant=False) if needs_grad else _logprob_entropy(*args)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps).reshape(tokens.shape), torch.cat(entropies).reshape(tokens.shape)
