"""What every rollout engine shares: the Rollout it returns, the sampling parameters, the RolloutBackend protocol
(generate, sync_weights), the checks each generate call runs, and the token sampling the engines draw with.

The env stays the single source of rewards: every engine fills a reset TokenVectorEnv until ``env.all_done`` and
returns its ``RolloutResult`` as a :class:`Rollout` (which adds the sampled tokens' log-probs). The engines:
hf.py (transformers + KV cache), static.py (fixed-shape decode, CUDA graphs), vllm.py, scripted.py (completions
written in advance); engines.py registers them by name.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

import torch

from algos.model.loading import context_length
from rlvr_env.token_vector_env import RolloutResult, TokenVectorEnv


@dataclass
class Rollout(RolloutResult):
    """The env's RolloutResult plus ``logprobs: Float[B, T]``: log-prob of each sampled token
    under the distribution it was drawn from (temperature, top-k, top-p applied), 0 after a row ends."""
    logprobs: torch.Tensor | None = None


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. Defaults mirror algos.config.RolloutConfig (plain sampling at T=1,
    so sampling log-probs equal the policy's). ``greedy`` takes the argmax (evaluation)."""
    temperature: float = 1.0
    top_p: float = 1.0  # 1.0 = off
    top_k: int = 0  # 0 = off
    greedy: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")


@runtime_checkable
class RolloutBackend(Protocol):
    def generate(self, model, env: TokenVectorEnv, *, seeds: list[int] | None = None, **sampling) -> Rollout:
        """Step the freshly reset ``env`` until every row is done; ``sampling`` overrides
        the backend's SamplingParams fields for this call (e.g. ``greedy=True``). ``seeds``: one per row
        (row_seeds), each row's samples drawn from its own; None: from the backend's generator."""
        ...

    def sync_weights(self, model) -> None:
        """Make the engine sample from ``model``'s weights as they are now. An engine with its own copy (vllm's, the
        static engine's compute-dtype copy: RolloutEngine.own_weights) copies them in; ``generate`` calls it itself
        whenever the parameters' versions (weights_version) changed since the last copy, so an optimizer step, a
        checkpoint load or a user's in-place edit is never missed. An engine sampling from ``model`` itself has
        nothing to do."""
        ...


def check_env_ready(env: TokenVectorEnv, model=None) -> None:
    """A freshly reset env whose rows fit ``model``'s context (model.loading.context_length; no model, no check)."""
    if env.all_done or env.num_generated.any():
        raise RuntimeError("the env must be freshly reset before a rollout: call env.reset() first")
    limit = context_length(model) if model is not None else None
    if limit is not None and env.prompt_width + env.max_new_tokens > limit:
        raise ValueError(
            f"the longest prompt ({env.prompt_width} tokens) + env.max_new_tokens ({env.max_new_tokens}) exceed the "
            f"model's max_position_embeddings ({limit}): lower env.max_new_tokens, or cap prompts with env.max_prompt_tokens"
        )


def check_seeds(env: TokenVectorEnv, seeds: list[int] | None) -> None:
    if seeds is not None and len(seeds) != env.num_envs:
        raise ValueError(f"seeds: one per env row, got {len(seeds)} for {env.num_envs} rows")


def checked_call(defaults: SamplingParams, model, env: TokenVectorEnv, seeds: list[int] | None,
                 sampling: dict) -> tuple[SamplingParams, torch.device]:
    """What an engine decoding ``model`` in this process checks first -> (``sampling`` over ``defaults``, the model's
    device): a freshly reset env whose rows fit the model, one seed a row, the env's tensors on the model's device."""
    params = dataclasses.replace(defaults, **sampling)
    check_env_ready(env, model)
    check_seeds(env, seeds)
    device = next(model.parameters()).device
    # The tensors' device, not env.device: torch.device("cuda") != the "cuda:0" its tensors report.
    if env.input_ids.device != device:
        raise ValueError(
            f"env tensors are on {env.input_ids.device} but the model is on {device}; build the env with device={device}"
        )
    return params, device


def _as_rollout(result: RolloutResult, logprobs: torch.Tensor | None) -> Rollout:
    values = {f.name: getattr(result, f.name) for f in fields(RolloutResult)}
    return Rollout(**values, logprobs=None if logprobs is None else logprobs * result.response_mask)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Float[B, V] logits -> Float[B, V] with tokens outside top-k / the top-p nucleus set to -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already cover top_p; the top token always stays.
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float[B, V] next-token logits -> (Long[B] tokens, Float[B] their log-probs under the sampling distribution).
    ``uniforms``: Float64[B] the rows' own U[0, 1) draws (row_uniforms); None draws them from ``generator``."""
    logits = filter_logits(logits.float() / params.temperature, params.top_k, params.top_p)
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.greedy:
        tokens = logits.argmax(-1)
    else:
        if uniforms is None:
            uniforms = torch.rand(logits.shape[0], generator=generator, device=logits.device, dtype=torch.float64)
        tokens = inverse_cdf_sample(logprobs.exp(), uniforms)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Float[B, V] probabilities, Float64[B] u ~ U[0, 1) -> Long[B] one draw per row: the first token whose cumulative
    probability exceeds u * total. One random number per row; torch.multinomial draws V exponentials per row (on CPU
    60 ms of each 270 ms decode step of 64 rows over SmolLM2's 49k vocabulary). The float64 sum keeps u * total below
    the total, and "right" never lands on a zero-probability token."""
    cumulative = probs.double().cumsum(-1)
    return torch.searchsorted(cumulative, uniforms[:, None] * cumulative[:, -1:], right=True).squeeze(-1)


def row_seeds(seed: int, rows: range) -> list[int]:
    """The sampling seed of each row of a batch: a pure function of (``seed``, the row's index in the whole batch),
    so a row draws the same tokens however the batch is split (across ranks, or into rounds of another size)."""
    import numpy as np

    return [int(np.random.SeedSequence([seed, row]).generate_state(1)[0]) for row in rows]


def row_uniforms(seeds: list[int], steps: int, device: torch.device) -> torch.Tensor:
    """Float64[B, steps]: row b's U[0, 1) draws for its first ``steps`` tokens, from its own seed."""
    draws = [torch.rand(steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in seeds]
    return torch.stack(draws).to(device)


def weights_version(model) -> tuple[int, ...]:
    """The parameters' version counters, which every in-place write (an optimizer step, load_state_dict) advances."""
    return tuple(param._version for param in model.parameters())


class WeightsSeen:
    """Which model an engine's own copy of the weights came from, and the weights' version then (weights_version). A
    weak reference: a model built later never matches, even at a freed model's address."""

    def __init__(self) -> None:
        self._model: weakref.ref | None = None
        self._version: tuple[int, ...] = ()

    def record(self, model) -> None:
        """The copy now holds ``model``'s weights as they are."""
        self._model, self._version = weakref.ref(model), weights_version(model)

    def is_model(self, model) -> bool:
        """The copy came from ``model`` (its weights may have changed since)."""
        return self._model is not None and self._model() is model

    def matches(self, model) -> bool:
        """The copy holds ``model``'s weights as they are now."""
        return self.is_model(model) and self._version == weights_version(model)


def check_continuations(contexts: list[list[int]], max_new_tokens: list[int], seeds: list[int] | None) -> None:
    """continue_rows' arguments: non-empty contexts, one budget of at least one token per context, one seed per
    context (or None); ValueError naming the argument otherwise."""
    if len(max_new_tokens) != len(contexts):
        raise ValueError(f"max_new_tokens: one per context, got {len(max_new_tokens)} for {len(contexts)} contexts")
    if seeds is not None and len(seeds) != len(contexts):
        raise ValueError(f"seeds: one per context, got {len(seeds)} for {len(contexts)} contexts")
    if any(budget < 1 for budget in max_new_tokens):
        raise ValueError(f"max_new_tokens: every context needs at least 1, got {min(max_new_tokens)}")
    if any(not context for context in contexts):
        raise ValueError("contexts: every context needs at least one token, got an empty one")
