"""Data parallelism on torch.distributed: one process per device, launched by torchrun (or srun).

One process (no WORLD_SIZE, or 1) is the plain single-device run: every helper here is then a no-op.
Under torchrun each rank holds a full replica (DDP) or a shard (FSDP2, ``fully_shard`` per decoder
layer and the root) of the policy; the trainers keep the config's global batch and split its prompts
across ranks (docs/distributed.md). The rules the trainers follow:

- every training forward goes through the wrapped module (``TrainingForward``): a call past it
  (the decoder alone, the LM head's weight) is not synchronised by DDP and fails under FSDP2;
- every rank runs the same collectives: counts and skip decisions are all-reduced, and a rank with
  fewer micro-batches pads with zero-weight ones (``padded_micro_batches``);
- losses are normalised by global counts and scaled by the world size, since DDP and FSDP2 average
  gradients over ranks.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from algos.config import require
from algos.system.runtime import weights_cast_once


@dataclass(frozen=True)
class World:
    """This process's place among the run's processes (rank 0 of 1 without torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    # Split mode (distributed.rollout_ranks): this process only generates, as rollout rank ``rollout_rank``
    # (torchrun's rank learners + rollout_rank), outside the learners' world; None: it learns
    rollout_rank: int | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0 and self.rollout_rank is None

    def span(self, count: int) -> range:
        """This rank's contiguous share of ``count`` items (count divisible by the world size)."""
        share = count // self.size
        return range(self.rank * share, (self.rank + 1) * share)


def launched_world() -> World:
    """The world torchrun (or srun with torchrun's variables) describes in the environment."""
    env = os.environ
    size = int(env.get("WORLD_SIZE", 1))
    return World(int(env.get("RANK", 0)), size, int(env.get("LOCAL_RANK", 0)), int(env.get("LOCAL_WORLD_SIZE", size)))


# Split mode's roles, set once by init_distributed: this process's World (the learners' world, or a rollout rank's)
_SPLIT_WORLD: World | None = None
_LEARNER_GROUP = None  # the learners' process group, in which a checkpoint is written and read
_ROLLOUT_RANKS = 0


def current_world() -> World:
    """The world of the process group this process joined (in split mode the learners', or a rollout rank's own);
    one process when it joined none."""
    if _SPLIT_WORLD is not None:
        return _SPLIT_WORLD
    if not dist.is_available() or not dist.is_initialized():
        return World()
    launched = launched_world()
    return World(dist.get_rank(), dist.get_world_size(), launched.local_rank, launched.local_size)


def init_distributed(cfg, device_name: str) -> World:
    """Join the process group torchrun set up (once per process): nccl on GPUs, gloo on CPUs unless
    ``cfg`` (config.distributed) says. A process not launched by torchrun stays alone (World())."""
    world = launched_world()
    if world.size == 1 or dist.is_initialized():
        return current_world()
    if cfg.rollout_ranks:  # before joining: a split that leaves no learner is refused on every rank alike
        require(cfg.rollout_ranks < world.size, "distributed.rollout_ranks",
                f"= {cfg.rollout_ranks} leaves no learner among torchrun's {world.size} processes: at most "
                f"{world.size - 1}")
    uses_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if uses_cuda else "gloo")
    if uses_cuda:
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.timeout_s))
    if world.rank != 0:  # one copy of what a run reports (the machine, the precision): rank 0's
        logging.getLogger("rlvr").setLevel(logging.WARNING)
    if cfg.rollout_ranks:
        _split(world, learners=world.size - cfg.rollout_ranks)
    return current_world()


def _split(world: World, learners: int) -> None:
    """Split mode's roles: ranks below ``learners`` learn (their own world, a process group of their own for
    checkpoints), the others generate; every rank creates the group (new_group is collective)."""
    global _SPLIT_WORLD, _LEARNER_GROUP, _ROLLOUT_RANKS
    _LEARNER_GROUP = dist.new_group(list(range(learners)))
    _ROLLOUT_RANKS = world.size - learners
    if world.rank < learners:
        _SPLIT_WORLD = World(world.rank, learners, world.local_rank, world.local_size)
    else:
        _SPLIT_WORLD = World(0, 1, world.local_rank, world.local_size, rollout_rank=world.rank - learners)


def learner_group():
    """The process group a checkpoint is written and read in: the learners' in split mode, else None (the default)."""
    return _LEARNER_GROUP


def _collective_group():
    """The process group this process's collectives run in: in split mode a learner's are the learners' (the rollout
    ranks never join them), else the default group (None)."""
    return _LEARNER_GROUP if _SPLIT_WORLD is not None and _SPLIT_WORLD.rollout_rank is None else None


def split_mode() -> bool:
    """Whether this run is split (distributed.rollout_ranks under torchrun): some ranks only generate."""
    return _SPLIT_WORLD is not None


def rollout_peer(rollout_rank: int) -> int:
    """torchrun's rank of split mode's rollout rank ``rollout_rank``: the learners come first."""
    return split_learners() + rollout_rank


def split_learners() -> int:
    """How many ranks learn in split mode: torchrun's ranks 0 .. split_learners() - 1."""
    return dist.get_world_size() - _ROLLOUT_RANKS


def device_for(world: World, device_name: str) -> str:
    """The device this rank computes on: its local GPU for "auto"/"cuda" under torchrun, else ``device_name``."""
    launched = world.size > 1 or world.rollout_rank is not None
    if launched and device_name.startswith("cuda:"):
        raise ValueError(f"config model.device = {device_name!r} puts every rank on one GPU: use 'auto' or 'cuda' "
                         "(each rank takes its LOCAL_RANK's GPU), or CUDA_VISIBLE_DEVICES to choose the GPUs")
    if launched and device_name in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{world.local_rank}"
    return device_name


def _reduce(values: Sequence[float], op) -> list[float]:
    if current_world().size == 1:
        return [float(v) for v in values]
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=op, group=_collective_group())
    return tensor.tolist()


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_over_ranks(*values: float) -> list[float]:
    """Each value summed over every rank (the values themselves in one process)."""
    return _reduce(values, dist.ReduceOp.SUM)


def max_over_ranks(*values: float) -> list[float]:
    return _reduce(values, dist.ReduceOp.MAX)


def min_over_ranks(*values: float) -> list[float]:
    return _reduce(values, dist.ReduceOp.MIN)


def gather_objects(value: Any) -> list[Any]:
    """[value of rank 0, value of rank 1, ...] on every rank (picklable values; ``[value]`` in one process)."""
    if current_world().size == 1:
        return [value]
    gathered: list[Any] = [None] * current_world().size
    dist.all_gather_object(gathered, value, group=_collective_group())
    return gathered


def gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's rows of ``tensor`` (any number per rank), concatenated in rank order, on ``tensor``'s device."""
    parts = gather_objects(tensor.detach().cpu())
    return torch.cat(parts).to(tensor.device) if len(parts) > 1 else tensor


def gather_padded(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """[n, T_rank] tensors of this rank -> (each as [sum of n, max T] over every rank, rank order, right-padded with
    0; the row where this rank's start). One process: the tensors themselves."""
    if current_world().size == 1:
        return list(tensors), 0
    ranks = gather_objects([t.detach().cpu() for t in tensors])
    width = max(part[0].shape[1] for part in ranks)
    device = tensors[0].device
    gathered = [torch.cat([torch.nn.functional.pad(part[i], (0, width - part[i].shape[1])) for part in ranks]).to(device)
                for i in range(len(tensors))]
    return gathered, sum(part[0].shape[0] for part in ranks[: current_world().rank])


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if current_world().size == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0, group=_collective_group())  # src: torchrun's rank 0, a learner
    return holder[0]


def broadcast_to_launch(value: Any) -> Any:
    """Rank 0's ``value`` on every process torchrun started: in split mode the rollout ranks too."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def send_object(value: Any, peer: int) -> None:
    """``value`` (picklable; tensors on the CPU) to torchrun's rank ``peer``, which takes it with receive_object."""
    dist.send_object_list([value], dst=peer)


def receive_object(peer: int) -> Any:
    """The next value torchrun's rank ``peer`` sent this process with send_object."""
    holder = [None]
    dist.recv_object_list(holder, src=peer)
    return holder[0]


def run_on_main(work) -> Any:
    """``work()`` on rank 0, its result (or the exception it raised) on every rank: a refusal on rank 0 (a run
    directory in use) stops every rank with its message instead of leaving them waiting."""
    outcome: tuple[bool, Any] | None = None
    if current_world().is_main:
        try:
            outcome = (True, work())
        except Exception as error:  # handed to every rank, raised there
            outcome = (False, error)
    succeeded, value = broadcast_from_main(outcome)
    if not succeeded:
        raise value
    return value


def rank_offset(count: int) -> int:
    """How many rows the ranks before this one hold, when each holds ``count``."""
    return int(sum(gather_objects(count)[: current_world().rank]))


def leave() -> None:
    """Leave the process group at the end of a command (torch warns at exit about one left open), then free what
    still holds its groups (a DDP or FSDP2 module a reference cycle keeps): a gloo group freed during interpreter
    exit instead can abort the process with "terminate called without an active exception" (torch PR 179291), as a
    2-rank resume did once in CI after finishing its work."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()


def barrier() -> None:
    if current_world().size > 1:
        dist.barrier(group=_collective_group())


class TrainingForward(torch.nn.Module):
    """The one module DDP or FSDP2 wraps: ``forward`` runs ``compute(*args)`` over the modules it holds, so the
    wrapper sees (and synchronises) every parameter that computation uses. ``compute`` may call the held modules'
    submodules and weights directly: under the wrapper's forward they are whole (FSDP2) and tracked (DDP)."""

    def __init__(self, **modules: torch.nn.Module) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)

    def forward(self, compute, *args, **kwargs):
        return compute(*args, **kwargs)


def decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP2 shards one by one: the modules the transformers models inside ``module`` list in
    their ``_no_split_modules`` (LlamaDecoderLayer, Qwen2DecoderLayer, ...)."""
    names = {name for m in module.modules() for name in getattr(m, "_no_split_modules", None) or ()}
    layers = [m for m in module.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError("config distributed.strategy = 'fsdp2': the model names no decoder layer class "
                         "(transformers' _no_split_modules) to shard; use distributed.strategy = 'ddp'")
    return layers


def wrap(forward: TrainingForward, world: World, strategy: str, device: torch.device,
         param_dtype: torch.dtype | None = None, some_frozen: bool = False) -> torch.nn.Module:
    """``forward`` as DDP or FSDP2 wraps it under a world of several ranks; as it is in one process.
    ``param_dtype``: FSDP2's mixed-precision compute dtype (weights and optimizer stay in theirs). ``some_frozen``:
    some steps leave trainable parameters without a gradient (PPO's critic warm-up), which DDP must be told."""
    if world.size == 1:
        return forward
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # Buffers (rotary tables) are constants: syncing them at every forward adds collectives, nothing else.
        return DistributedDataParallel(forward, device_ids=[device] if device.type == "cuda" else None,
                                       forward_sync_buffers=False, find_unused_parameters=some_frozen,
                                       process_group=_collective_group())
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # FSDP2 does not broadcast initial weights: make every rank start from rank 0's (a value head seeded per rank).
    group = _collective_group()
    for tensor in forward.state_dict().values():
        dist.broadcast(tensor.data if hasattr(tensor, "data") else tensor, src=0, group=group)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    # sharded over the learners only in split mode (a mesh of their group), else over every rank (FSDP2's default)
    mesh = {"mesh": DeviceMesh.from_group(group, device.type)} if group is not None else {}
    for layer in decoder_layers(forward):
        fully_shard(layer, mp_policy=policy, **mesh)
    sharded = fully_shard(forward, mp_policy=policy, **mesh)
    with torch.no_grad():  # FSDP2 sets its state up at the root's first forward: before a rollout calls a layer alone
        sharded(lambda: None)
    sharded.reshard()  # the root keeps its weights whole after a forward; the optimizer must see the shards
    return sharded


def is_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def whole_weights(wrapped: torch.nn.Module) -> Iterator[None]:
    """Inside: an FSDP2-sharded module's weights are gathered whole and stay so, so a rollout or an evaluation can
    run any number of forwards without collectives (ranks decode different lengths). DDP/one process: a no-op."""
    if not is_sharded(wrapped):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in wrapped.modules() if isinstance(m, FSDPModule)]
    for module in sharded:
        module.set_reshard_after_forward(False, recurse=False)
    for module in sharded:
        module.unshard()
    try:
        yield
    finally:
        for module in sharded:
            module.reshard()
            module.set_reshard_after_forward(True, recurse=False)


@contextlib.contextmanager
def gradient_sync(wrapped: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """DDP: all-reduce gradients only in the last backward of an accumulation (``enabled``); FSDP2 reduces its
    shards at every backward, and one process has nothing to reduce."""
    if enabled or not hasattr(wrapped, "no_sync"):
        yield
        return
    with wrapped.no_sync():
        yield


def accumulation_passes(wrapped: torch.nn.Module, micro: list[slice | None], device_type: str) -> Iterator[slice | None]:
    """The micro-batches of one gradient accumulation, each yielded for its forward and backward: DDP all-reduces only
    in the last (gradient_sync), and under autocast each weight is cast to the half dtype once for all of them
    (weights_cast_once; measured on SmolLM2 in bf16, 8 micro-batches: 25.5 -> 24.2 s an update, less peak memory).
    The weights change only at the optimizer step after the accumulation, when the cast cache is gone."""
    with weights_cast_once(device_type):
        for index, rows in enumerate(micro):
            with gradient_sync(wrapped, enabled=index == len(micro) - 1):
                yield rows


def padded_micro_batches(slices: list[slice]) -> list[slice | None]:
    """``slices`` followed by None up to the most micro-batches any rank has: every rank runs as many forwards
    and backwards (a None is a zero-weight one), which DDP's and FSDP2's collectives need."""
    most = int(max_over_ranks(len(slices))[0])
    return [*slices, *([None] * (most - len(slices)))]


def zero_weight_inputs(pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The zero-weight pass's input (a padded_micro_batches None): one row of two pad tokens with a one-token prompt."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
    return ids, torch.ones_like(ids), 1


def micro_batch_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int, rows, pad_id: int):
    """([n, P+T] ids, [n, P+T] mask, prompt width) of a micro-batch's ``rows``; for a padded_micro_batches None, the
    zero-weight pass's input (zero_weight_inputs)."""
    if rows is None:
        return zero_weight_inputs(pad_id, input_ids.device)
    return input_ids[rows], attention_mask[rows], prompt_width
