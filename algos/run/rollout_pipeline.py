"""Rollouts that overlap training (rollout.max_staleness = k): an actor thread samples the batches while the learner
updates.

Step t trains on the batch drawn by the weights of optimizer step ``max(start, t - 1 - k)`` (``drawing_version``; 0
is the initial weights, ``start`` the step a run resumed after), from seeds fixed by t (RunSetup.sample). The batch
a step gets is therefore a pure function of the run's seed and config, whatever the threads' timing: a k = 1 run is as
deterministic as a synchronous one, and k = 0 is the synchronous run itself (SynchronousRollouts: no thread, no copy).

For k >= 1 (BackgroundRollouts) the actor samples from a snapshot of the policy, its own copy, on a thread with its
own copy of the rollout backend (vllm's engine is shared instead, its calls serialized: VLLMRollout) and, on a GPU,
its own CUDA stream. After each of its optimizer steps the learner stages the
weights the actor will need (only the trainable tensors: a LoRA run stages its adapters); the actor copies them into
its snapshot between two batches, never inside one. Batch t + 1 + k is then drawn while the learner updates on t.
The loss's rollout correction (loss.rollout_correction; "auto" is "tis" here) weighs each token by pi_old / pi_behaviour
with the log-probs recorded at sampling, which is what makes a stale batch usable.

In split mode (distributed.rollout_ranks = M under torchrun) the actor is another process: rollout rank j draws the
steps t with (t - 1) % M == j (RolloutServer, run by run_training in place of the loop), the whole step as one process
draws it, and sends each of the L learner ranks (RemoteRollouts) its share of the rows with the batch's version; the
first learner sends it the weights each batch is drawn by, point-to-point. The same steps, seeds and weights: a split
run's batches are the colocated one-process run's, bitwise, and its L learners (DDP or FSDP2 among themselves) train
on them as one process does.

A checkpoint at step s holds the batches s + 1 .. s + k already drawn (``state``; in split mode every learner's share
of them): re-drawing them would need the weights of steps s - k .. s - 1, which no checkpoint keeps. A run resumed
under another k, or on another number of learners, drops them (counted in ``async/dropped_batches``) and draws from its
checkpoint's weights on.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from algos.system.distributed import (
    current_world,
    gather_objects,
    receive_object,
    rollout_peer,
    send_object,
    split_learners,
    split_mode,
    whole_weights,
)
from algos.system.runtime import mixed_precision

log = logging.getLogger("rlvr")
LEARNER = 0  # torchrun's rank of split mode's first learner, which sends the weights

# collect(step, policy=..., backend=...) -> (the step's batch, its rollout metrics): an algorithm's sampling of one
# step (GRPO's rounds, rewards and advantages); policy and backend None: the run's own
Collect = Callable[..., tuple[Any, dict[str, float]]]


def drawing_version(step: int, max_staleness: int, start_step: int) -> int:
    """The optimizer step whose weights draw step ``step``'s batch: ``step - 1 - max_staleness``, never before the
    weights the run started (or resumed) from."""
    return max(start_step, step - 1 - max_staleness)


@dataclass
class DrawnBatch:
    """A batch drawn ahead: the step that trains on it, the optimizer step whose weights drew it, the batch, and its
    rollout metrics."""
    step: int
    version: int
    batch: Any
    metrics: dict[str, float]


def kept_in_flight(saved: dict[str, Any] | None, max_staleness: int, device: torch.device,
                   learner: int = 0, learners: int = 1) -> tuple[dict[int, DrawnBatch], int]:
    """A checkpoint's batches in flight (a pipeline's state(), read onto the CPU) -> (those kept by step, on
    ``device``; how many were dropped): kept when drawn under this rollout.max_staleness (and, split, for as many
    learners: this one, ``learner`` of ``learners``, takes its share), all dropped (and said) otherwise."""
    if not saved:
        return {}, 0
    saved_learners = saved.get("learners", 1)
    if saved["max_staleness"] == max_staleness and saved_learners == learners:
        return {drawn.step: dataclasses.replace(drawn, batch=_map_tensors(
            drawn.batch[learner] if "learners" in saved else drawn.batch, lambda t: t.to(device)))
            for drawn in saved["batches"]}, 0
    shared = f" for {saved_learners} learner ranks, and {learners} learn now" if saved_learners != learners else ""
    log.warning(f"rollout.max_staleness = {max_staleness}: the checkpoint's {len(saved['batches'])} batches in flight "
                f"were drawn under {saved['max_staleness']}{shared}; dropped, drawn again from the checkpoint's weights")
    return {}, len(saved["batches"])


def row_shares(batch: Any, parts: int, unit: int) -> list[Any]:
    """``batch`` cut into ``parts`` contiguous shares of whole units of ``unit`` rows (a prompt's group, a preference
    pair), as even as the units allow, the first shares the larger: every tensor and list in it is cut along its first
    dimension, its rows (tuples, mappings and dataclasses are looked into, other values kept). None (no rows) and a
    share without rows are None."""
    if batch is None:
        return [None] * parts
    rows = _row_count(batch)
    if rows % unit:
        raise ValueError(f"a batch of {rows} rows does not split into whole units of {unit} rows")
    units = rows // unit
    bounds = [unit * (part * (units // parts) + min(part, units % parts)) for part in range(parts + 1)]
    return [_map_rows(batch, slice(start, stop), rows) if stop > start else None
            for start, stop in zip(bounds, bounds[1:])]


def _row_count(value: Any) -> int:
    """The rows of a batch: its first tensor's first dimension."""
    found: list[int] = []
    _map_tensors(value, lambda tensor: found.append(tensor.shape[0]) if not found else None)
    if not found:
        raise ValueError("a batch without a tensor has no rows to share among learners")
    return found[0]


def _map_rows(value: Any, rows: slice, count: int) -> Any:
    """``value`` with its tensors and lists (each of ``count`` rows) cut to ``rows``."""
    def cut(item: Any) -> Any:
        if isinstance(item, list) and len(item) != count:
            raise ValueError(f"a batch's list of {len(item)} items is not one per row ({count} rows)")
        return item[rows] if isinstance(item, (torch.Tensor, list)) else _LOOK_INSIDE

    return _rebuilt(value, cut)


def async_metrics(step: int, drawn: DrawnBatch, dropped: int, learner_wait: float, engine_wait: float) -> dict:
    """What a step logs of the batch it trains on under rollout.max_staleness or split mode (docs/distributed.md)."""
    return {**drawn.metrics, "async/staleness": float(step - 1 - drawn.version),
            "async/weights_version": float(drawn.version), "async/dropped_batches": float(dropped),
            "async/learner_wait_s": learner_wait, "async/engine_wait_s": engine_wait}


class SynchronousRollouts:
    """rollout.max_staleness = 0: each step's batch drawn by the current weights when the step asks for it."""

    def __init__(self, collect: Collect) -> None:
        self.collect = collect

    def batch_for(self, step: int) -> tuple[Any, dict[str, float]]:
        """Step ``step``'s batch, drawn now, and its metrics with the time drawing it took (time/rollout_s)."""
        started = time.perf_counter()
        batch, metrics = self.collect(step)
        return batch, {**metrics, "time/rollout_s": time.perf_counter() - started}

    def weights_after(self, step: int) -> None:
        """Nothing to stage: the next batch is drawn by the policy itself."""

    def state(self, step: int) -> dict[str, Any]:
        """Nothing drawn ahead."""
        return {}

    def close(self) -> None:
        """No thread to stop."""


class BackgroundRollouts:
    """rollout.max_staleness = k >= 1: batches drawn on a thread of their own from a snapshot of the policy, each by
    the weights ``drawing_version`` names (see the module's docstring)."""

    def __init__(self, collect: Collect, *, policy: torch.nn.Module, backend: Any, config: Any, device: torch.device,
                 start_step: int, last_step: int, saved: dict[str, Any] | None = None) -> None:
        self.collect, self.policy, self.backend = collect, policy, backend
        self.max_staleness, self.start_step, self.last_step = config.rollout.max_staleness, start_step, last_step
        self.model_config, self.device = config.model, device
        self._drawn, self._dropped = kept_in_flight(saved, self.max_staleness, device)
        self._first_to_draw = max(self._drawn, default=start_step) + 1
        # The actor's copy of the policy, and the trainable tensors it refreshes between batches (frozen ones, e.g. a
        # LoRA run's base weights, never change)
        self._snapshot = copy.deepcopy(policy).eval().requires_grad_(False)
        trained = {name for name, param in policy.named_parameters() if param.requires_grad}
        self._snapshot_trained = [param for name, param in self._snapshot.named_parameters() if name in trained]
        self._snapshot_version = start_step
        self._staged: dict[int, list[torch.Tensor]] = {}  # optimizer step -> its trainable weights, until drawn with
        self._condition = threading.Condition()
        self._stopping = False
        self._failure: BaseException | None = None
        self._learner_wait = self._engine_wait = 0.0
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        if device.type == "cpu":
            log.warning(f"rollout.max_staleness = {self.max_staleness} on a CPU: the actor and the learner share its "
                        f"{torch.get_num_threads()} threads' cores, so overlapping gains only what one phase leaves "
                        "idle (bench/overlap.py measures it; on 2 cores it was slower than synchronous)")
        self._thread: threading.Thread | None = None  # started by the first batch asked for

    # ---- the learner's side ----------------------------------------------------------------------------------------
    def batch_for(self, step: int) -> tuple[Any, dict[str, float]]:
        """Step ``step``'s batch and its metrics (with the async/* ones), waiting for the actor when it is not drawn
        yet."""
        self._start()
        started = time.perf_counter()
        with self._condition:
            self._condition.wait_for(lambda: step in self._drawn or self._failure is not None)
            self._raise_failure()
            drawn = self._drawn.pop(step)
            engine_wait, self._engine_wait = self._engine_wait, 0.0
            dropped, self._dropped = self._dropped, 0
        if self._stream is not None:  # freed later, its memory must not go back to the actor before the learner is done
            stream = torch.cuda.current_stream(self.device)
            _map_tensors(drawn.batch, lambda tensor: tensor.record_stream(stream) if tensor.is_cuda else None)
        return drawn.batch, async_metrics(step, drawn, dropped, time.perf_counter() - started, engine_wait)

    def weights_after(self, step: int) -> None:
        """Stage the policy's weights of optimizer step ``step`` (all its updates done) for the batch they will draw,
        if any is left to draw."""
        if step + 1 + self.max_staleness > self.last_step:
            return
        staged = [param.detach().clone() for param in _trainable(self.policy)]
        if self._stream is not None:  # the copies are made before the actor's stream reads them
            torch.cuda.current_stream(self.device).synchronize()
        with self._condition:
            self._staged[step] = staged
            self._condition.notify_all()

    def state(self, step: int) -> dict[str, Any]:
        """What a checkpoint at ``step`` keeps: the batches drawn for the steps after it (waiting for them: their
        weights are all staged), and the rollout.max_staleness they were drawn under."""
        wanted = range(step + 1, min(step + self.max_staleness, self.last_step) + 1)
        self._start()
        with self._condition:
            self._condition.wait_for(lambda: all(s in self._drawn for s in wanted) or self._failure is not None)
            self._raise_failure()
            return {"max_staleness": self.max_staleness, "batches": [self._drawn[s] for s in wanted]}

    def close(self) -> None:
        """Stop the actor after the batch it is drawing."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._draw_all, name="rlvr-rollouts", daemon=True)
            self._thread.start()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError("the rollout thread (rollout.max_staleness) failed") from self._failure

    # ---- the actor's side ------------------------------------------------------------------------------------------
    def _draw_all(self) -> None:
        try:
            with self._actor_context():
                for step in range(self._first_to_draw, self.last_step + 1):
                    if self._stopping or not self._hold_weights(drawing_version(step, self.max_staleness,
                                                                                self.start_step)):
                        return
                    started = time.perf_counter()
                    batch, metrics = self.collect(step, policy=self._snapshot, backend=self.backend)
                    metrics["async/draw_s"] = time.perf_counter() - started
                    if self._stream is not None:  # the batch is complete before the learner's stream reads it
                        self._stream.synchronize()
                    with self._condition:
                        self._drawn[step] = DrawnBatch(step, self._snapshot_version, batch, metrics)
                        self._condition.notify_all()
        except BaseException as error:  # handed to the learner, which raises it from batch_for
            with self._condition:
                self._failure = error
                self._condition.notify_all()

    def _hold_weights(self, version: int) -> bool:
        """Load the staged weights of optimizer step ``version`` into the snapshot (waiting for the learner to stage
        them); False when the run is stopping."""
        if version == self._snapshot_version:
            return True
        started = time.perf_counter()
        with self._condition:
            self._condition.wait_for(lambda: version in self._staged or self._stopping)
            if self._stopping:
                return False
            staged = self._staged.pop(version)
            self._engine_wait += time.perf_counter() - started
        with torch.no_grad():
            for mine, theirs in zip(self._snapshot_trained, staged, strict=True):
                mine.copy_(theirs)
        if self._stream is not None:  # the staged copies (the learner's memory) are read before they are freed
            self._stream.synchronize()
        self._snapshot_version = version
        return True

    @contextlib.contextmanager
    def _actor_context(self) -> Iterator[None]:
        """What the learner's thread runs under, set again on this one (autocast and grad mode are per thread), and
        the actor's own CUDA stream."""
        stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with stream, torch.no_grad(), mixed_precision(self.model_config, self.device):
            yield


_LOOK_INSIDE = object()  # what _rebuilt's ``leaf`` answers for a value it leaves to be looked into


def _rebuilt(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` rebuilt through ``leaf``, asked first of it and then of every item found by looking into dataclasses,
    mappings, lists and tuples (nested): its answer replaces the value, or _LOOK_INSIDE looks into it (any other value
    is kept)."""
    mapped = leaf(value)
    if mapped is not _LOOK_INSIDE:
        return mapped
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        copied = copy.copy(value)
        for item in dataclasses.fields(value):
            object.__setattr__(copied, item.name, _rebuilt(getattr(value, item.name), leaf))
        return copied
    if isinstance(value, dict):
        return {key: _rebuilt(item, leaf) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuilt(item, leaf) for item in value)
    return value


def _map_tensors(value: Any, function: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` (a dataclass, mapping, list or tuple of them, nested) with ``function`` applied to every tensor
    (a result of None keeps the tensor)."""
    def apply(item: Any) -> Any:
        if not isinstance(item, torch.Tensor):
            return _LOOK_INSIDE
        mapped = function(item)
        return item if mapped is None else mapped

    return _rebuilt(value, apply)


def _sendable_copies(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of the trainable tensors to send (on the CPU under gloo): copies, because the optimizer changes the
    weights in place, and FSDP2 frees whole ones, while a send without waiting may still read them."""
    on_cpu = dist.get_backend() == "gloo"
    return [weight.detach().to("cpu" if on_cpu else weight.device, copy=True).contiguous() for weight in weights]


def _send_weights(tensors: list[torch.Tensor], peer: int) -> list:
    """``tensors`` (_sendable_copies) to torchrun's rank ``peer``, without waiting: the transfers' works and tensors,
    to keep until done."""
    return [(dist.isend(tensor, peer), tensor) for tensor in tensors]


def _receive_weights(into: list[torch.Tensor], peer: int) -> None:
    """torchrun's rank ``peer``'s trainable tensors (_send_weights) copied into ``into``."""
    on_cpu = dist.get_backend() == "gloo"
    with torch.no_grad():
        for param in into:
            buffer = torch.empty_like(param, device="cpu") if on_cpu else torch.empty_like(param)
            dist.recv(buffer, src=peer)
            param.copy_(buffer)


def _trainable(model: torch.nn.Module) -> list[torch.Tensor]:
    return [param for param in model.parameters() if param.requires_grad]


class RemoteRollouts:
    """Split mode (distributed.rollout_ranks = M), a learner's side: its share of step t's batch comes from rollout
    rank (t - 1) % M, drawn there by the weights drawing_version names, which the first learner sends that rank after
    the optimizer step that made them (without waiting; every learner holds the same weights). The shares arrive in
    their steps' order from each rank."""

    def __init__(self, *, policy: torch.nn.Module, forward: torch.nn.Module, config: Any, device: torch.device,
                 start_step: int, last_step: int, saved: dict[str, Any] | None = None) -> None:
        self.policy, self.forward, self.device = policy, forward, device
        self.max_staleness, self.start_step, self.last_step = config.rollout.max_staleness, start_step, last_step
        self.rollout_ranks = config.distributed.rollout_ranks
        world = current_world()
        self.learners, self.sends_weights = world.size, world.rank == 0
        self._drawn, self._dropped = kept_in_flight(saved, self.max_staleness, device, world.rank, world.size)
        self._first_to_draw = max(self._drawn, default=start_step) + 1
        self._sending: list = []  # weights on their way: (work, tensor), kept until done
        self._started = False

    def _peer(self, step: int) -> int:
        return rollout_peer((step - 1) % self.rollout_ranks)

    def _start(self) -> None:
        """Tell every rollout rank where the run starts, and send it the weights it starts from (the first learner)."""
        if self._started:
            return
        self._started = True
        peers = [rollout_peer(index) for index in range(self.rollout_ranks)]
        if self.sends_weights:
            for peer in peers:
                send_object({"start_step": self.start_step, "first_to_draw": self._first_to_draw}, peer)
        self._send_weights_to(peers)

    def _send_weights_to(self, peers: list[int]) -> None:
        """The policy's trainable weights, whole, from the first learner to ``peers``; every learner calls it (under
        FSDP2 all of them gather the weights whole)."""
        with whole_weights(self.forward):
            weights = _sendable_copies(_trainable(self.policy)) if self.sends_weights else []
        self._sending = [(work, tensor) for work, tensor in self._sending if not work.is_completed()]
        for peer in peers if self.sends_weights else []:
            self._sending += _send_weights(weights, peer)

    def _receive(self, step: int) -> None:
        """Take this learner's shares from step ``step``'s rank until step ``step``'s is here."""
        while step not in self._drawn:
            drawn = receive_object(self._peer(step))
            self._drawn[drawn.step] = dataclasses.replace(drawn, batch=_map_tensors(drawn.batch,
                                                                                     lambda t: t.to(self.device)))

    def batch_for(self, step: int) -> tuple[Any, dict[str, float]]:
        self._start()
        started = time.perf_counter()
        self._receive(step)
        drawn, dropped = self._drawn.pop(step), self._dropped
        self._dropped = 0
        return drawn.batch, async_metrics(step, drawn, dropped, time.perf_counter() - started,
                                          drawn.metrics.pop("async/engine_wait_s", 0.0))

    def weights_after(self, step: int) -> None:
        """Send the weights of optimizer step ``step`` to the rank that draws the batch they draw, if one is left (the
        first learner sends; every learner calls it)."""
        drawn_by = step + 1 + self.max_staleness
        if self._first_to_draw <= drawn_by <= self.last_step:
            self._send_weights_to([self._peer(drawn_by)])

    def state(self, step: int) -> dict[str, Any]:
        """What a checkpoint at ``step`` keeps: the batches drawn for the steps after it, each with every learner's
        share (gathered: the first learner writes the checkpoint). Every learner calls it."""
        wanted = range(step + 1, min(step + self.max_staleness, self.last_step) + 1)
        self._start()
        for later in wanted:
            self._receive(later)
        shares = gather_objects([_map_tensors(self._drawn[later].batch, lambda t: t.cpu()) for later in wanted])
        batches = [dataclasses.replace(self._drawn[later], batch=[mine[index] for mine in shares])
                   for index, later in enumerate(wanted)]
        return {"max_staleness": self.max_staleness, "learners": self.learners, "batches": batches}

    def close(self) -> None:
        """Wait for the weights still on their way."""
        for work, _ in self._sending:
            work.wait()
        self._sending = []


class RolloutServer:
    """Split mode, a rollout rank's side: draws the steps (t - 1) % M == its index names, each whole (as one process
    draws it) by the weights drawing_version names (received from the first learner, copied into this rank's own model
    between batches), and sends each learner its share of the rows (row_shares, whole units of ``unit`` rows) with the
    batch's version. Run by run_training in place of the training loop."""

    def __init__(self, collect: Collect, *, model: torch.nn.Module, config: Any, rollout_rank: int,
                 unit: int) -> None:
        self.collect, self.model, self.rollout_rank, self.unit = collect, model, rollout_rank, unit
        self.max_staleness, self.last_step = config.rollout.max_staleness, config.run.steps
        self.rollout_ranks = config.distributed.rollout_ranks

    def serve(self) -> None:
        plan = receive_object(LEARNER)
        trainable = _trainable(self.model)
        _receive_weights(trainable, LEARNER)
        version = plan["start_step"]
        learners = split_learners()
        for step in range(plan["first_to_draw"], self.last_step + 1):
            if (step - 1) % self.rollout_ranks != self.rollout_rank:
                continue
            started = time.perf_counter()
            wanted = drawing_version(step, self.max_staleness, plan["start_step"])
            if wanted != version:
                _receive_weights(trainable, LEARNER)
                version = wanted
            waited, started = time.perf_counter() - started, time.perf_counter()
            with torch.no_grad():
                batch, metrics = self.collect(step)
            metrics.update({"async/engine_wait_s": waited, "async/draw_s": time.perf_counter() - started})
            on_cpu = _map_tensors(batch, lambda t: t.cpu())
            for learner, share in enumerate(row_shares(on_cpu, learners, self.unit)):
                send_object(DrawnBatch(step, version, share, metrics), learner)

    def close(self) -> None:
        """Nothing to wait for: each batch was sent whole."""


def rollout_pipeline(run: Any, collect: Collect, start_step: int, saved: dict[str, Any] | None = None, *,
                     unit: int = 1) -> Any:
    """The pipeline a trainer draws its batches through: SynchronousRollouts under rollout.max_staleness 0, else
    BackgroundRollouts with its own copy of the run's backend (a deepcopy: vllm's is the engine itself); in split
    mode a rollout rank's RolloutServer or a learner's RemoteRollouts. ``saved``: a resumed checkpoint's state().
    ``unit``: rows a learner's share keeps together in split mode (a prompt's group, a preference pair)."""
    config = run.config
    if run.world.rollout_rank is not None:
        return RolloutServer(collect, model=run.model, config=config, rollout_rank=run.world.rollout_rank, unit=unit)
    if split_mode():
        return RemoteRollouts(policy=run.model, forward=run.forward, config=config, device=run.device,
                              start_step=start_step, last_step=config.run.steps, saved=saved)
    if config.rollout.max_staleness == 0:
        return SynchronousRollouts(collect)
    return BackgroundRollouts(collect, policy=run.model, backend=copy.deepcopy(run.backend), config=config,
                              device=run.device, start_step=start_step, last_step=config.run.steps, saved=saved)
