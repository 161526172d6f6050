"""Decoder layers compiled for the training forwards (model.compile_layers), switched on around those calls alone.

On a GPU the update is launch-bound: one forward and backward of SmolLM2 launches ~10,000 kernels from Python for
~45 ms of GPU work (an H200 profile: the GPU busy 8.5% of the update), most of them elementwise (RMSNorm's 7, rotary,
casts, residual adds). ``torch.compile`` of a decoder layer fuses them, and every layer shares the one compiled graph
(their weights are its inputs), compiled once with dynamic shapes, so a batch of another width reuses it (a width
equal to a fixed size of the model, its head dimension, is specialised: Dynamo's duck sizing, one more compile; so is
a micro-batch of one row, which the first step's memory probe runs: 0/1 specialisation). Inside, the layers always get
their attention mask as a tensor (attention.materialized_masks): transformers passes None for rows without padding,
and Dynamo compiled a graph for each. On an H200 the update of 64 rows went from 0.37 to 0.08 s (docs/performance.md).

A layer compiled this way must never see a KV cache: Dynamo specialises on the cache's layer index and would compile
each layer anew. So the training forward runs rows whole (``completion_logprobs``), and decoding, evaluation and any
other call of the model run the layers as they are: the compiled callables serve only inside ``compiled_layers``.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from algos.model.attention import materialized_masks

# model -> each decoder layer's compiled call
_COMPILED: weakref.WeakKeyDictionary[torch.nn.Module, list[tuple[torch.nn.Module, Any]]] = weakref.WeakKeyDictionary()


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's decoder layers (``model.model.layers`` in transformers' decoder-only models)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise TypeError(f"{type(model).__name__}'s decoder has no `layers` list to compile (model.compile_layers)")
    return layers


def compile_decoder_layers(model: torch.nn.Module, **options: Any) -> int:
    """Prepare ``model``'s decoder layers for ``compiled_layers``: each one's call through ``torch.compile`` (full
    graph, dynamic shapes; ``options`` over those, e.g. a test's backend). Compilation itself happens at the first
    compiled call; where it fails (no compiler for the backend, a layer it cannot trace), that call runs eager, one
    warning says why, and the model's training forwards run eager from then on. Returns how many layers."""
    options = {"fullgraph": True, "dynamic": True, **options}
    layers = decoder_layers(model)
    _COMPILED[model] = [(layer, _falling_back(model, layer, torch.compile(layer._call_impl, **options))) for layer in layers]
    return len(layers)


def _falling_back(model: torch.nn.Module, layer: torch.nn.Module, compiled_call):
    owner = weakref.ref(model)  # a value of _COMPILED must not keep its key alive

    def call(hidden_states, *args, **kwargs):
        if torch.is_grad_enabled() and not hidden_states.requires_grad:
            # The first layer's input under a frozen embedding (LoRA): without this, Dynamo guards on requires_grad
            # and compiles that layer apart from the others (two graphs, twice the compile time)
            hidden_states = hidden_states.detach().requires_grad_()
        try:
            return compiled_call(hidden_states, *args, **kwargs)
        except (torch._dynamo.exc.BackendCompilerFailed, torch._dynamo.exc.Unsupported) as error:
            cause = getattr(error, "inner_exception", None) or error  # the backend's own error, else Dynamo's
            reason = (str(cause).strip().splitlines() or [""])[0]
            warnings.warn(f"model.compile_layers: compiling {type(layer).__name__} failed, the training forwards run "
                          f"eager from now on ({type(cause).__name__}: {reason})", stacklevel=1)
            for each, _ in _COMPILED.pop(owner()):  # registered: the layers call this only while it is
                each._compiled_call_impl = None
            return layer._call_impl(hidden_states, *args, **kwargs)

    return call


def has_compiled_layers(model: torch.nn.Module) -> bool:
    """Whether ``compile_decoder_layers`` prepared this model."""
    return model in _COMPILED


@contextlib.contextmanager
def compiled_layers(model: torch.nn.Module) -> Iterator[None]:
    """Inside: a prepared model's layers run compiled (torch.nn.Module.__call__ takes ``_compiled_call_impl``, the hook
    Module.compile sets); after, as they were. Nothing for a model that was not prepared."""
    compiled = _COMPILED.get(model, [])
    before = [layer._compiled_call_impl for layer, _ in compiled]  # None, unless a layer was compiled by its owner
    for layer, call in compiled:
        layer._compiled_call_impl = call
    try:
        with materialized_masks(model) if compiled else contextlib.nullcontext():
            yield
    finally:
        for (layer, _), call in zip(compiled, before):
            layer._compiled_call_impl = call


def resolve_compile_layers(setting: str, device: torch.device, *, world_size: int, gradient_checkpointing: bool) -> str:
    """model.compile_layers "auto" -> "on" or "off" for this run (one process on CUDA, layers not recomputed: on);
    "on" elsewhere than one process raises ValueError naming the key: DDP's and FSDP2's hooks are not traced here."""
    if setting == "on" and world_size > 1:
        raise ValueError(f"config model.compile_layers: 'on' runs in one process only, this run has {world_size} "
                         f"(torchrun); set it to 'auto' or 'off'")
    if setting != "auto":
        return setting
    return "on" if device.type == "cuda" and world_size == 1 and not gradient_checkpointing else "off"
