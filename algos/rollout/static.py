"""StaticRollout: the rollout engine for GPUs, whose decode step has the same shapes from the first token to the last.

HFRollout's decode loop is launch-bound on a GPU: each token is ~600 small kernels of a 30-layer model issued one by
one from Python, its mask grows a column per token and its cache shrinks as rows finish (a new attention plan per
shape), and it asks the GPU whether every row is done after every token. Measured on an H200 with SmolLM2-135M, a
rollout kept the GPU busy 4% of its time. This engine instead

- decodes into a KV cache and a mask preallocated for ``[rows, prompt + max_new_tokens]``: every row, finished or not,
  decodes each step (finished rows into padding), and "are all rows done" is asked once every ``check_every`` tokens;
- builds its attention masks itself, as transformers would from a 2D mask: causal over each row's columns, and for
  a model's sliding-window layers the window too (AttentionLayout: one mask, or a dict by layer type where sliding
  and full layers mix, as in Gemma 2/3);
- keeps the tokens, log-probs and each row's random draws on the device, sampled inside the step (inverse CDF on
  draws made before the loop, so no RNG runs in the step);
- replays those ``check_every`` steps as one CUDA graph (captured once per (rows, width, sampling) bucket), or runs
  them under torch.compile(fullgraph=True, dynamic=False), or eagerly (``graph``);
- samples from its own copy of the weights in the run's compute dtype (bf16 under bf16 autocast; a LoRA policy's with
  its adapter merged in), refreshed in place after each optimizer step (``sync_weights``): the graph's weights stay
  where it recorded them, and no decode step re-casts the fp32 weights; the copy's RMSNorms run as one fused kernel
  each (fuse_rms_norms).

The env takes the whole token matrix at the end (``env.finish_with``) and decides where each row ends, as with vllm.
``continue_rows`` continues token lists of any lengths the same way, which EpisodeDriver plays multi-turn episodes with.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import math
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from algos.config import require
from algos.core.padding import left_padded
from algos.model.lora import has_lora, merged_copy, merged_state_dict
from algos.model.policy import position_ids_from_mask
from algos.rollout.base import (
    Rollout,
    SamplingParams,
    WeightsSeen,
    _as_rollout,
    check_continuations,
    checked_call,
    row_uniforms,
    sample_tokens,
)
from algos.rollout.engines import ROLLOUT_ENGINES, RolloutEngine
from algos.rollout.multiturn import EpisodeDriver
from algos.system.runtime import DTYPES, compute_dtype, release_free_memory
from rlvr_env.token_vector_env import TokenVectorEnv

GRAPH_MODES = ("auto", "cuda", "compile", "eager")
PROMPT_BUCKET = 32  # prompt widths round up to this, so a step's graph serves prompts of nearby lengths


def bucketed(width: int) -> int:
    """``width`` rounded up to a multiple of PROMPT_BUCKET: the widths (prompts, continue_rows' spans) a graph serves."""
    return math.ceil(width / PROMPT_BUCKET) * PROMPT_BUCKET


class FixedKVCache:
    """A KV cache of fixed shape: per layer keys and values [rows, kv_heads, width, head_dim], allocated at the first
    write and written in place from ``column`` on (one column for every row: prompts are left-padded to one width).
    Duck-types the one method transformers' attention layers call on a cache (``update``); the model never sizes
    its mask from it because the engine passes ready 4D masks (attention_layout: one, or one per layer type)."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.rows, self.width = rows, width
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.column = torch.zeros(1, dtype=torch.long, device=device)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key/value [rows, kv_heads, q, head_dim] written at columns column..column+q-1 -> the layer's whole cache."""
        if layer_idx == len(self.keys):
            self.keys.append(key.new_zeros(self.rows, key.shape[1], self.width, key.shape[3]))
            self.values.append(value.new_zeros(self.rows, value.shape[1], self.width, value.shape[3]))
        columns = self.column + torch.arange(key.shape[-2], device=key.device)
        self.keys[layer_idx].index_copy_(2, columns, key)
        self.values[layer_idx].index_copy_(2, columns, value)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool[..., K] keys a query may attend to -> the same shape in ``dtype``: 0 where allowed, the dtype's lowest
    value elsewhere (what eager and SDPA attention both add to the scores; -inf would give NaN for a row that
    allows nothing)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)


@dataclass(frozen=True)
class AttentionLayout:
    """Which masks a decoder's layers attend under, as transformers builds them from a 2D mask: ``window`` the
    sliding window of its sliding-window layers (None: none), under which a query at cache column q sees the keys
    at columns q - window < k <= q (masking_utils.sliding_window_overlay: a key ``window`` columns back is out);
    ``keyed``: layers of both kinds (Gemma 2/3, Qwen2 from max_window_layers on), so the engine passes a dict of
    masks keyed by layer type ("full_attention", "sliding_attention"), which those models route to each layer as
    generate's own precomputed masks are; else one 4D mask serves every layer."""

    window: int | None = None
    keyed: bool = False

    def within(self, width: int) -> AttentionLayout:
        """This layout over ``width`` cache columns: a window that spans them all masks nothing more."""
        return self if self.window is not None and self.window < width else AttentionLayout()

    def masks(self, full: torch.Tensor, out_of_window: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """``full`` the additive [B, 1, Q, K] causal mask, ``out_of_window`` Bool broadcasting to it (keys a window
        back or more) -> what the decoder takes as ``attention_mask``."""
        if self.window is None:
            return full
        sliding = full.masked_fill(out_of_window, torch.finfo(full.dtype).min)
        return {"full_attention": full, "sliding_attention": sliding} if self.keyed else sliding


def attention_layout(decoder) -> AttentionLayout:
    """The masks ``decoder``'s layers need (AttentionLayout). Refused with one line (ValueError) where this engine's
    masks would not be the model's own: chunked or non-causal attention, or layer types other than full and sliding.
    A config's ``sliding_window`` counts where the model's code reads it (Mistral, Phi-3, Qwen2, Gemma 2...); set on
    a family whose layers never use one (Llama), it changes nothing here, as in transformers."""
    config = decoder.config.get_text_config()
    name = type(decoder).__name__
    refusal = static_refusal(decoder.config, name)
    if refusal is not None:
        raise ValueError(f"{refusal}: use rollout.backend = 'hf'")
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        kinds = set(layer_types[: config.num_hidden_layers])
        if "sliding_attention" not in kinds:
            return AttentionLayout()
        if not window:
            raise ValueError(f"{name} has sliding_attention layers but no config.sliding_window: use rollout.backend "
                             "= 'hf'")
        return AttentionLayout(window=int(window), keyed=len(kinds) > 1)
    modeling = {type(module).__module__ for module in decoder.modules()}  # a wrapper's, its layers' own
    if window and any(_reads_sliding_window(name) for name in modeling if not name.startswith("torch.")):
        return AttentionLayout(window=int(window))
    return AttentionLayout()


def static_refusal(model_config, name: str | None = None) -> str | None:
    """Why StaticRollout cannot sample a model of this (transformers) config, or None: its masks are causal, full
    or sliding-window, and chunked or bidirectional attention, or other layer types, would not be the model's own."""
    config = model_config.get_text_config()
    name = name or (getattr(model_config, "architectures", None) or [config.model_type])[0]
    if getattr(config, "attention_chunk_size", None) or not getattr(config, "is_causal", True) or getattr(
            config, "use_bidirectional_attention", False):
        return (f"StaticRollout builds causal and sliding-window masks only, and {name} attends otherwise (chunked or "
                "bidirectional attention)")
    layer_types = getattr(config, "layer_types", None)
    kinds = set(layer_types[: config.num_hidden_layers]) if layer_types is not None else set()
    if not kinds <= {"full_attention", "sliding_attention"}:
        return f"StaticRollout builds full and sliding-window masks only, and {name} has layers of types {sorted(kinds)}"
    return None


@functools.cache
def _reads_sliding_window(module_name: str) -> bool:
    """Whether the modeling code of a model (its module's source) mentions ``sliding_window``; where the source
    cannot be read, assume it does (the config's window is then honoured)."""
    try:
        return "sliding_window" in inspect.getsource(sys.modules[module_name])
    except (KeyError, OSError, TypeError):
        return True


@dataclass
class DecodeState:
    """Every tensor a decode step reads and writes, at fixed addresses (a captured graph replays on them)."""

    cache: FixedKVCache
    mask: torch.Tensor  # [B, 1, 1, W] additive: a column opens when the step that writes it runs
    last_token: torch.Tensor  # Long[B, 1] the token each row feeds next
    position: torch.Tensor  # Long[B, 1] its position id
    step: torch.Tensor  # Long[1] the token column this step fills
    tokens: torch.Tensor  # Long[B, S] sampled ids (pad once a row has finished)
    logprobs: torch.Tensor  # Float[B, S] their log-probs under the sampling distribution, 0 once finished
    finished: torch.Tensor  # Bool[B] rows that have sampled a stop token or taken their budget
    budget: torch.Tensor  # Long[B] the tokens each row may take
    uniforms: torch.Tensor  # Float64[B, S] each row's U[0, 1) draw per token
    is_stop: torch.Tensor  # Bool[V] stop ids
    params: SamplingParams
    vocab: int
    pad_id: int
    layout: AttentionLayout = AttentionLayout()  # the decoder's sliding window over the cache's columns, if any
    key_columns: torch.Tensor | None = None  # Long[W] 0..W-1: the cache columns, for the sliding window
    graph: object = None  # torch.cuda.CUDAGraph of check_every steps, or a compiled function, or None (eager)


@dataclass
class DecodeRequest:
    """One batch to decode: ``prompt_ids``/``prompt_mask`` Long[P, L] the distinct contexts, left-padded (each
    prefilled once); ``row_prompts`` Long[B] the context of each row; ``budgets`` Long[B] the tokens each row may take;
    ``draws`` Float64[B, n] each row's U[0, 1) draws (None: greedy); ``span`` the token columns decoded into
    (at least the largest budget; one bucket's graphs serve every batch of the same span)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    row_prompts: torch.Tensor
    budgets: torch.Tensor
    draws: torch.Tensor | None
    span: int
    stop_ids: tuple[int, ...]
    vocab: int
    pad_id: int


class StaticRollout:
    """Steps a TokenVectorEnv with a transformers causal LM in fixed shapes (see the module's docstring).

    ``decode_dtype``: the dtype it samples in (None: the model's own); when it differs from the model's, the engine
    keeps its own copy of the model in that dtype, refreshed in place when the model's weights change.
    ``graph``: "auto" (a CUDA graph on CUDA, eager elsewhere), "cuda", "compile" (torch.compile of the steps, with
    ``compile_options``), or "eager". ``check_every``: tokens between checks that every row has finished.
    ``seed``: as HFRollout's (draws from a private generator; None: torch's global RNG); ``generate(seeds=)``
    gives each row its own draws (row_uniforms), the same ones HFRollout uses, so both sample the same tokens.
    ``continue_rows`` continues token lists of any lengths (a multi-turn episode's turns: EpisodeDriver), in buckets
    of rows (a power of two) and widths (multiples of 32) so that a few captured graphs serve a whole episode.
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 decode_dtype: torch.dtype | None = None, graph: str = "auto", check_every: int = 8,
                 compile_options: dict | None = None) -> None:
        if graph not in GRAPH_MODES:
            raise ValueError(f"graph must be one of {GRAPH_MODES}, got {graph!r}")
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.decode_dtype, self.graph_mode, self.check_every = decode_dtype, graph, check_every
        self.compile_options = compile_options or {}
        self._decoder: torch.nn.Module | None = None  # the copy sampled from (or the model itself)
        self.weights_seen = WeightsSeen()  # the model the decoder holds, and its weights' version then
        self._states: dict[tuple, DecodeState] = {}
        self._pool = None  # one CUDA graph memory pool for every bucket

    # ---- weights -----------------------------------------------------------------------------------------------
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the decoder hold ``model``'s weights now: copied in place into the existing copy (its captured graphs
        stay valid), or a new copy (or the model itself) for a model not seen before."""
        if not self.weights_seen.is_model(model):
            self._states.clear()  # graphs recorded another model's weights
            dtype = self.decode_dtype or next(model.parameters()).dtype
            if has_lora(model):  # a plain copy with the adapter merged in: no decode step runs LoRA kernels
                self._decoder = merged_copy(model, dtype).eval().requires_grad_(False)
                fuse_rms_norms(self._decoder)
            elif dtype == next(model.parameters()).dtype:
                self._decoder = model
            else:
                self._decoder = copy.deepcopy(model).to(dtype).eval().requires_grad_(False)
                for param in self._decoder.parameters():
                    param.grad = None
                fuse_rms_norms(self._decoder)
        elif self._decoder is not model:
            with torch.no_grad():
                if has_lora(model):  # W + scale * B @ A, computed apart from the policy's own weights
                    merged = merged_state_dict(model)
                    for name, mine in self._decoder.named_parameters():
                        mine.copy_(merged[name])
                else:
                    for mine, theirs in zip(self._decoder.parameters(), model.parameters()):
                        mine.copy_(theirs)
        self.weights_seen.record(model)

    @contextlib.contextmanager
    def _decoding(self, model) -> Iterator[torch.nn.Module]:
        """The decoder holding ``model``'s current weights, in eval mode, outside the run's autocast when it is a copy
        in its own dtype (autocast would only re-cast what is cast already); memory released after."""
        if not self.weights_seen.matches(model):
            self.sync_weights(model)
        decoder = self._decoder
        implementation = getattr(decoder.config, "_attn_implementation", "sdpa")
        if implementation not in ("sdpa", "eager"):
            raise ValueError(f"StaticRollout passes a 4D mask, which {implementation!r} attention does not take: load "
                             "the model with attn_implementation='sdpa' (or use rollout.backend = 'hf')")
        was_training = decoder.training
        decoder.eval()
        device = next(decoder.parameters()).device
        try:
            with torch.autocast(device.type, enabled=False) if decoder is not model else contextlib.nullcontext():
                yield decoder
        finally:
            decoder.train(was_training)
            release_free_memory()

    # ---- one rollout -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, model, env: TokenVectorEnv, *, seeds: list[int] | None = None, **sampling) -> Rollout:
        params, device = checked_call(self.params, model, env, seeds, sampling)
        rows, max_new = env.num_envs, env.max_new_tokens
        draws = None
        if not params.greedy:
            draws = (row_uniforms(seeds, max_new, device) if seeds is not None
                     else torch.rand(rows, max_new, generator=self.generator, dtype=torch.float64).to(device))
        first_rows = torch.arange(0, rows, env.group_size, device=device)  # a group's rows share their prompt
        request = DecodeRequest(
            prompt_ids=env.prompt_ids[first_rows], prompt_mask=env.prompt_mask[first_rows],
            row_prompts=torch.arange(rows, device=device) // env.group_size,
            budgets=torch.full((rows,), max_new, device=device), draws=draws, span=max_new,
            stop_ids=tuple(env.stop_ids.tolist()), vocab=int(env.single_action_space.n),  # gymnasium: a numpy int
            pad_id=env.pad_id)
        with self._decoding(model) as decoder:
            tokens, logprobs = self._decode(decoder, request, params)
        result = env.finish_with(tokens)
        return _as_rollout(result, logprobs[:, : result.response_ids.shape[1]].float())

    @torch.no_grad()
    def continue_rows(self, model, contexts: list[list[int]], *, max_new_tokens: list[int], stop_ids: list[int],
                      vocab_size: int, seeds: list[int] | None = None,
                      **sampling) -> list[tuple[list[int], list[float]]]:
        """Each token list in ``contexts`` continued: (its tokens up to and including the first of ``stop_ids``, at
        most its ``max_new_tokens``; their log-probs), drawn from ids below ``vocab_size``. ``seeds``: one per
        context, whose draws its tokens take in order (row_uniforms); None: this engine's generator. ``sampling``
        overrides the engine's SamplingParams fields. The contexts are padded to a bucket of rows and widths."""
        check_continuations(contexts, max_new_tokens, seeds)
        params = dataclasses.replace(self.params, **sampling)
        device = next(model.parameters()).device
        count, longest = len(contexts), max(max_new_tokens)
        rows = 1 << (count - 1).bit_length()  # a power of two: a shrinking set of rows reuses a few buckets
        budgets = list(max_new_tokens) + [0] * (rows - count)  # the padding rows are done before they start
        draws = None
        if not params.greedy:
            if seeds is not None:
                draws = torch.full((rows, longest), 0.5, dtype=torch.float64, device=device)
                for row, (seed, budget) in enumerate(zip(seeds, max_new_tokens)):
                    draws[row, :budget] = row_uniforms([seed], budget, device)[0]
            else:
                draws = torch.rand(rows, longest, generator=self.generator, dtype=torch.float64).to(device)
        distinct: dict[tuple[int, ...], int] = {}  # a group's first turn: G rows, one prompt, prefilled once
        row_prompts = [distinct.setdefault(tuple(context), len(distinct)) for context in contexts]
        row_prompts += [0] * (rows - count)
        prompt_ids, prompt_mask = left_padded([list(context) for context in distinct], 0, device)
        request = DecodeRequest(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, row_prompts=torch.tensor(row_prompts, device=device),
            budgets=torch.tensor(budgets, device=device),
            draws=draws, span=bucketed(longest), stop_ids=tuple(stop_ids),
            vocab=vocab_size, pad_id=stop_ids[0] if stop_ids else 0)
        with self._decoding(model) as decoder:
            tokens, logprobs = self._decode(decoder, request, params)
        stops = set(stop_ids)
        continued = []
        for ids, row_logprobs, budget in zip(tokens.tolist(), logprobs.float().tolist(), max_new_tokens):
            ids = ids[:budget]
            end = next((i + 1 for i, token in enumerate(ids) if token in stops), len(ids))
            continued.append((ids[:end], row_logprobs[:end]))
        return continued

    def _decode(self, decoder, request: DecodeRequest, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's rows decoded in fixed shapes until each has sampled a stop token or taken its budget ->
        (Long[B, T] tokens, pad after a row's end; Float[B, T] their log-probs), T the columns decoded."""
        device = request.prompt_ids.device
        prompt_width = request.prompt_ids.shape[1]
        bucket = bucketed(prompt_width)
        logits, prompt_cache = self._prefill(decoder, request.prompt_ids, request.prompt_mask)
        state = self._state_for(decoder, request, params, bucket, prompt_cache, device)

        # Fill the bucket's tensors in place for this batch.
        pad_columns = bucket - prompt_width
        for layer, (keys, values) in enumerate(zip(prompt_cache.keys, prompt_cache.values)):
            state.cache.keys[layer][:, :, :pad_columns].zero_()
            state.cache.values[layer][:, :, :pad_columns].zero_()
            state.cache.keys[layer][:, :, pad_columns:bucket].copy_(keys.index_select(0, request.row_prompts))
            state.cache.values[layer][:, :, pad_columns:bucket].copy_(values.index_select(0, request.row_prompts))
        prompt_mask = request.prompt_mask.index_select(0, request.row_prompts)
        allowed = torch.zeros(prompt_mask.shape[0], state.cache.width, dtype=torch.bool, device=device)
        allowed[:, pad_columns:bucket] = prompt_mask.bool()
        state.mask.copy_(additive_mask(allowed, state.mask.dtype)[:, None, None, :])
        state.uniforms.fill_(0.5)
        if request.draws is not None:
            state.uniforms[:, : request.draws.shape[1]] = request.draws
        state.tokens.fill_(request.pad_id)
        state.logprobs.zero_()
        state.budget.copy_(request.budgets)

        # The first token, from the prefill's logits.
        first, first_logprobs = sample_tokens(logits.index_select(0, request.row_prompts)[:, : state.vocab], params,
                                              None, None if params.greedy else state.uniforms[:, 0])
        state.tokens[:, 0] = first
        state.logprobs[:, 0] = first_logprobs
        state.finished.copy_(state.is_stop[first] | (state.budget <= 1))
        state.last_token.copy_(first[:, None])
        state.position.copy_(position_ids_from_mask(prompt_mask)[:, -1:] + 1)
        state.step.fill_(1)
        state.cache.column.fill_(bucket)

        taken, longest = 1, int(request.budgets.max())
        while taken < longest and not bool(state.finished.all()):  # one host sync per check_every tokens
            self._run_steps(decoder, state)
            taken += self.check_every
        width = min(taken, longest)
        return state.tokens[:, :width], state.logprobs[:, :width]

    def _prefill(self, decoder, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, FixedKVCache]:
        """Long[P, L] left-padded contexts, each once -> (its last position's logits [P, V], its cache)."""
        device = prompt_ids.device
        prompt_mask = prompt_mask.bool()
        width = prompt_ids.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        # A padding query attends to itself only: its output is never read, and a row allowing nothing is NaN-prone.
        allowed = (causal & prompt_mask[:, None, None, :]) | torch.eye(width, dtype=torch.bool, device=device)
        cache = FixedKVCache(prompt_ids.shape[0], width, device)
        dtype = next(decoder.parameters()).dtype
        if torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        layout = attention_layout(decoder).within(width)
        out_of_window = None
        if layout.window is not None:  # key k lies a window or more before query q
            out_of_window = torch.ones(width, width, dtype=torch.bool, device=device).tril(-layout.window)
        logits = decoder(
            input_ids=prompt_ids,
            attention_mask=layout.masks(additive_mask(allowed, dtype), out_of_window),
            position_ids=position_ids_from_mask(prompt_mask),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        return logits, cache

    # ---- the fixed-shape steps ---------------------------------------------------------------------------------
    def _state_for(self, decoder, request: DecodeRequest, params, bucket, prompt_cache, device) -> DecodeState:
        rows = request.budgets.shape[0]
        key = (rows, bucket, request.span, request.vocab, params, request.pad_id, request.stop_ids)
        if key in self._states:
            return self._states[key]
        span = request.span + self.check_every  # overshoot: the last replay may run past
        cache = FixedKVCache(rows, bucket + span, device)
        for keys, values in zip(prompt_cache.keys, prompt_cache.values):
            cache.keys.append(keys.new_zeros(rows, keys.shape[1], cache.width, keys.shape[3]))
            cache.values.append(values.new_zeros(rows, values.shape[1], cache.width, values.shape[3]))
        is_stop = torch.zeros(max(request.vocab, max(request.stop_ids, default=0) + 1), dtype=torch.bool, device=device)
        is_stop[list(request.stop_ids)] = True
        state = DecodeState(
            cache=cache,
            mask=torch.zeros(rows, 1, 1, cache.width, dtype=prompt_cache.keys[0].dtype, device=device),
            last_token=torch.zeros(rows, 1, dtype=torch.long, device=device),
            position=torch.zeros(rows, 1, dtype=torch.long, device=device),
            step=torch.zeros(1, dtype=torch.long, device=device),
            tokens=torch.zeros(rows, span, dtype=torch.long, device=device),
            logprobs=torch.zeros(rows, span, dtype=torch.float32, device=device),
            finished=torch.zeros(rows, dtype=torch.bool, device=device),
            budget=torch.zeros(rows, dtype=torch.long, device=device),
            uniforms=torch.full((rows, span), 0.5, dtype=torch.float64, device=device),
            is_stop=is_stop, params=params, vocab=request.vocab, pad_id=request.pad_id,
            layout=attention_layout(decoder).within(cache.width),
            key_columns=torch.arange(cache.width, device=device),
        )
        state.graph = self._build_graph(decoder, state, device)
        self._states = {k: v for k, v in list(self._states.items())[-3:]}  # a few buckets: each holds a KV cache
        self._states[key] = state
        return state

    def _graph_kind(self, device: torch.device) -> str:
        if self.graph_mode == "auto":
            return "cuda" if device.type == "cuda" else "eager"
        if self.graph_mode == "cuda" and device.type != "cuda":
            raise ValueError(f"graph='cuda' needs a CUDA device, the model is on {device}")
        return self.graph_mode

    def _build_graph(self, decoder, state: DecodeState, device: torch.device):
        kind = self._graph_kind(device)
        if kind == "eager":
            return None
        if kind == "compile":
            # Dynamo keeps a function's graphs on its code object, at most recompile_limit (8) of them, and under
            # fullgraph the ninth is an error: a multi-turn run passes through more buckets than that. So each bucket
            # compiles its own copy of the steps (a new code object, one graph), freed with its bucket.
            steps = types.FunctionType(StaticRollout._steps.__code__.replace(), globals(), "_steps")
            return torch.compile(types.MethodType(steps, self), fullgraph=True, dynamic=False, **self.compile_options)
        # Warm-up on a side stream before capture (cuBLAS workspaces, lazy inits), as torch.cuda.graphs' docs do; the
        # counters are reset after, and generate fills every tensor before the first replay.
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._reset_counters(state)
                self._steps(decoder, state)
        torch.cuda.current_stream(device).wait_stream(stream)
        self._reset_counters(state)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        try:
            # thread_local: the learner's thread may launch its own work meanwhile (rollout.max_staleness)
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                self._steps(decoder, state)
        except RuntimeError as error:  # a model whose forward syncs with the host, or a backend without capture
            warnings.warn(f"StaticRollout: the decode step could not be captured as a CUDA graph, so it runs eagerly "
                          f"(same tokens, slower): {str(error).splitlines()[0]}", RuntimeWarning, stacklevel=2)
            return None
        return graph

    @staticmethod
    def _reset_counters(state: DecodeState) -> None:
        state.step.zero_()
        state.cache.column.zero_()
        state.position.zero_()

    def _run_steps(self, decoder, state: DecodeState) -> None:
        if isinstance(state.graph, torch.cuda.CUDAGraph):
            state.graph.replay()
        elif state.graph is not None:
            state.graph(decoder, state)
        else:
            self._steps(decoder, state)

    def _steps(self, decoder, state: DecodeState) -> None:
        for _ in range(self.check_every):
            decode_step(decoder, state)


def fuse_rms_norms(model: torch.nn.Module) -> int:
    """Run each of ``model``'s Llama-style RMSNorms (``weight * normalize(x.float()).to(x.dtype)``) as torch's one
    F.rms_norm; returns how many. transformers' RMSNorm is 7 kernels, a third of a decode step's launches on
    SmolLM2. A norm whose output F.rms_norm does not reproduce (Gemma's ``1 + weight``) is left as it is."""
    fused = 0
    for module in model.modules():
        eps, weight = getattr(module, "variance_epsilon", None), getattr(module, "weight", None)
        if not type(module).__name__.endswith("RMSNorm") or eps is None or weight is None or weight.ndim != 1:
            continue
        probe = torch.randn(4, weight.shape[0], generator=torch.Generator().manual_seed(0)).to(weight)  # not the run's RNG
        fused_forward = functools.partial(_rms_norm, module, eps)
        with torch.no_grad():
            close = torch.allclose(fused_forward(probe).float(), module(probe).float(), rtol=2e-2, atol=2e-2)
        if close:
            module.forward = fused_forward
            fused += 1
    return fused


def _rms_norm(module: torch.nn.Module, eps: float, hidden_states: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(hidden_states, (hidden_states.shape[-1],), module.weight, eps)


def decode_step(decoder, state: DecodeState) -> None:
    """One token for every row, in place on ``state`` and with its shapes alone: no host sync, no allocation that
    depends on the data (a CUDA graph replays it)."""
    state.mask.index_fill_(3, state.cache.column, 0.0)  # the column this step's input token is written to
    out_of_window = None
    if state.layout.window is not None:  # the keys a window or more before this step's column
        out_of_window = state.key_columns <= state.cache.column - state.layout.window
    logits = decoder(
        input_ids=state.last_token, attention_mask=state.layout.masks(state.mask, out_of_window),
        position_ids=state.position,
        past_key_values=state.cache, use_cache=True,
    ).logits[:, -1, : state.vocab]
    uniforms = None if state.params.greedy else state.uniforms.index_select(1, state.step).squeeze(1)
    tokens, logprobs = sample_tokens(logits, state.params, None, uniforms)
    tokens = tokens.masked_fill(state.finished, state.pad_id)  # finished rows decode into padding
    state.tokens.index_copy_(1, state.step, tokens[:, None])
    state.logprobs.index_copy_(1, state.step, logprobs.masked_fill(state.finished, 0.0)[:, None])
    state.finished.logical_or_(state.is_stop[tokens]).logical_or_(state.budget <= state.step + 1)
    state.last_token.copy_(tokens[:, None])
    state.position.add_(1)
    state.cache.column.add_(1)
    state.step.add_(1)


@dataclass
class StaticEngineConfig:
    """The config's [static] section: the static engine's own keys, read when rollout.backend is "static"."""
    # Its decode steps (StaticRollout's graph): "auto" (StaticRollout's default: a CUDA graph on CUDA, eager on a
    # CPU), "cuda", "compile" (torch.compile, fullgraph, static shapes), or "eager" (to debug).
    decode_graph: str = "auto"

    def validate(self) -> None:
        require(self.decode_graph in GRAPH_MODES, "static.decode_graph",
                f"must be 'auto', 'cuda', 'compile' or 'eager', got {self.decode_graph!r}")


def build_static_rollout(config, sampling: dict[str, Any], multiturn: bool):
    """rollout.backend = "static": fixed-shape decode steps replayed as CUDA graphs, from a copy of the weights in
    the run's compute dtype; a multi-turn task's episodes through EpisodeDriver, one continue_rows call per turn."""
    engine = StaticRollout(**sampling, decode_dtype=DTYPES[compute_dtype(config.model)],
                           graph=config.engine_sections["static"].decode_graph)
    if multiturn:
        return EpisodeDriver(engine, max_episode_tokens=config.rollout.max_episode_tokens)
    return engine


# own_weights: under bf16 autocast it samples from a bf16 copy, whose log-probs are not the trainer's to the bit
ROLLOUT_ENGINES.register("static", RolloutEngine(build_static_rollout, plays_multiturn=True, own_weights=True,
                                                 refuses=static_refusal, samples_while_training=True,
                                                 section=StaticEngineConfig))
