"""What every agent shares around its own collect/update: one setup (setup_run) and one loop (run_training).

setup_run builds a run in the one order in which a refused task, model or config leaves no run
directory behind (and deletes no earlier run's checkpoints); run_training evaluates, warm-starts a
fresh run when warm_start.steps asks (algos/run/warm_start.py), steps, logs and checkpoints. GRPO/DAPO
(algos/algorithms/grpo.py) and PPO (algos/algorithms/ppo.py) add their optimizer, their state and their step.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from algos.config import require
from algos.model.compiled import compile_decoder_layers
from algos.model.dither import dither_to_grid
from algos.model.loading import load_policy
from algos.model.lora import apply_lora, has_lora
from algos.model.policy import check_lm_head
from algos.rollout import (
    ROLLOUT_ENGINES,
    RolloutBackend,
    build_task,
    make_env,
    make_rollout_backend,
)
from algos.run import warm_start
from algos.run.alarms import HealthMonitor
from algos.run.best_model import BestModel
from algos.run.directory import BEST_MODEL_DIR, open_run_dir
from algos.run.evaluation import (
    asks_the_same,
    eval_task,
    evaluate,
    evaluate_sampled,
    transfer_eval_config,
    warn_if_eval_reads_training_data,
)
from algos.run.reporting import CompletionLog, MetricsLogger, SilentLogger
from algos.run.resolve import resolve_run_config
from algos.run.setup import RunSetup
from algos.system.distributed import init_distributed, run_on_main, split_learners, split_mode, whole_weights
from algos.system.paths import latest_checkpoint
from algos.system.runtime import DTYPES, grad_scaler, mixed_precision, seed_everything
from rlvr_env.curriculum import StepSchedule

log = logging.getLogger("rlvr")


def setup_run(
    config: Any,
    *,
    resume: bool = False,
    backend: RolloutBackend | None = None,
    keep_reference: bool = False,
    check_task: Callable[[Any], None] | None = None,
) -> RunSetup:
    """Validate ``config``, join the torchrun process group when launched by one and resolve the config (a copy:
    algos/run/resolve.py), then build its task (``check_task`` may refuse it), seed, load and check the policy, and
    open the run directory (rank 0); then the reference model (``keep_reference``), an env of this rank's share of
    rollout.prompts_per_step x rollout.group_size rows and the rollout backend (default: the one config.rollout
    names, e.g. a ScriptedRollout). The RunSetup holds the resolved config."""
    config.validate()
    world = init_distributed(config.distributed, config.model.device)
    resolved = resolve_run_config(config, world, custom_backend=backend is not None)
    config, device, machine = resolved.config, resolved.device, resolved.machine
    count, group_size = config.rollout.prompts_per_step, config.rollout.group_size
    # the processes that learn, each on its share of a step: all of torchrun's, or split mode's learners (every rank
    # checks the learners' count, so a rollout rank refuses what they refuse instead of waiting for them)
    learners, which = ((split_learners(), "learner processes (torchrun's less distributed.rollout_ranks)") if split_mode()
                       else (world.size, "processes (torchrun's world size)"))
    require(count % learners == 0, "rollout.prompts_per_step", f"{count} prompts do not split across {learners} "
            f"{which}: make it a multiple of {learners}; each learner trains on its share of them")
    require(config.warm_start.batch_size % learners == 0, "warm_start.batch_size",
            f"must be a multiple of the {learners} {which}: each takes its share")
    task, eval_set = build_task(config), eval_task(config)  # the evaluation set once: a dataset's file is read once
    if check_task is not None:
        check_task(task)
    check_overlap(config, world.size, custom_backend=backend is not None)
    seed_everything(config.run.seed, config.run.full_determinism)
    model, tokenizer = load_policy(config.model.path, dtype=DTYPES[config.model.dtype], device=device)
    check_lm_head(model, len(tokenizer))  # also refuses an LM head that is not a bias-free Linear
    lora = getattr(config, "lora", None)
    if lora is not None and lora.r > 0:
        require(not (keep_reference and config.warm_start.steps), "lora.r",
                "a LoRA run's KL reference is its base model (the adapter disabled), which a warm start would leave "
                "behind: set warm_start.steps = 0, or the KL coefficient to 0, or lora.r = 0")
        model = apply_lora(model, lora)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        log.info(f"LoRA r={lora.r} alpha={lora.alpha:g} on {lora.target_modules}: {trainable:,} trainable parameters "
                 f"of {total:,} ({trainable / total:.2%})")
    if config.model.gradient_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise ValueError(f"config model.gradient_checkpointing: {type(model).__name__} does not support it")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.model.dither_weights and config.model.autocast is not None:
        moved, total = dither_to_grid(model, DTYPES[config.model.autocast], seed=config.run.seed)
        machine["dithered_weights"] = moved
        if moved:
            log.info(f"weights: {moved:,} of {total:,} trainable matrix weights lay on {config.model.autocast}'s grid, "
                     f"moved inside half a grid step so that its forwards see small updates (model.dither_weights)")
    if machine["compiled_layers"]:
        compile_decoder_layers(model)
    layers = "compiled (torch.compile, rows whole)" if machine["compiled_layers"] else "eager"
    log.info(f"training forwards: decoder layers {layers} (model.compile_layers {config.model.compile_layers})")

    def open_on_main() -> Path | None:
        checkpoint = open_run_dir(config, resume)
        (Path(config.run.output_dir) / "machine.json").write_text(json.dumps(machine, indent=2) + "\n")
        return checkpoint

    # a rollout rank (split mode) writes nothing; the learner sends it where the run starts (RolloutServer)
    checkpoint = run_on_main(open_on_main) if world.rollout_rank is None else None
    # From the initial weights, before any checkpoint is loaded: the KL anchor does not follow training. A warm-started
    # run's is the warm-started policy: set after the warm start (warm_start.save_warm_started), read back on a resume.
    # Under LoRA the reference is the policy itself with its adapter disabled: no second copy of the weights. A rollout
    # rank (split mode) only samples and scores, the learners compute every KL: it keeps none.
    keep_reference = keep_reference and world.rollout_rank is None
    ref_model = (model if has_lora(model) else copy.deepcopy(model).eval().requires_grad_(False)) if keep_reference else None
    if ref_model is not None and ref_model is not model and machine["compiled_layers"]:
        compile_decoder_layers(ref_model)
    if ref_model is not None and ref_model is not model and checkpoint is not None and config.warm_start.steps:
        warm_start.load_warm_started(ref_model, Path(config.run.output_dir))
    env = make_env(config, tokenizer, num_envs=count // world.size * group_size, device=device, task=task, model=model)
    if world.is_main:
        warn_if_eval_reads_training_data(config, task)
    draws_rank_0s_batches = world.rank == 0 and world.rollout_rank in (None, 0)
    completions = CompletionLog(config.run.output_dir, config.run.log_completions) if (
        config.run.log_completions and draws_rank_0s_batches) else None
    return RunSetup(
        config=config, device=device, model=model, tokenizer=tokenizer, ref_model=ref_model, env=env,
        backend=backend if backend is not None else make_rollout_backend(config), eval_set=eval_set,
        scaler=grad_scaler(config.model, device), output_dir=Path(config.run.output_dir), checkpoint=checkpoint,
        world=world, schedule=StepSchedule(config.env.schedule, "env.schedule"), completions=completions,
    )


def check_overlap(config: Any, world_size: int, *, custom_backend: bool) -> None:
    """rollout.max_staleness >= 1 in one process needs an engine that samples beside training
    (RolloutEngine.samples_while_training; a backend passed in is taken to; in split mode any engine samples, in its own
    process) and, for now, one process: the actor's collectives would interleave with the learner's."""
    staleness, engine = config.rollout.max_staleness, config.rollout.backend
    if not staleness:
        return
    require(custom_backend or split_mode() or ROLLOUT_ENGINES[engine].samples_while_training, "rollout.max_staleness",
            f"= {staleness} samples on a thread beside training, which rollout.backend = {engine!r} cannot: use "
            f"{', '.join(repr(name) for name, e in ROLLOUT_ENGINES.items() if e.samples_while_training)}, split mode "
            f"(torchrun with distributed.rollout_ranks, where every engine samples in a process of its own), or set it to 0")
    require(world_size == 1 or config.distributed.rollout_ranks, "rollout.max_staleness",
            f"= {staleness} overlaps in one process, or in split mode (distributed.rollout_ranks), and torchrun "
            f"started {world_size} processes that each sample and learn: set distributed.rollout_ranks, or this to 0")


class Agent(Protocol):
    """What run_training needs from an algorithm's trainer (GRPOTrainer, PPOTrainer, DPOTrainer)."""
    run: RunSetup
    backend: RolloutBackend  # the one it trains with (run.backend unless replaced), which evaluation uses too
    start_step: int
    rollouts: Any  # where its batches come from (algos/run/rollout_pipeline.py); a rollout rank serves them; closed at the end

    def train_step(self, step: int, logger: MetricsLogger) -> dict[str, float]: ...  # collect + update; the step's metrics
    def save(self, step: int) -> Path: ...
    # Optional: ``headline_metrics`` (metric key -> short name), what the step line and the bar show first when the
    # shared keys (algos.run.reporting.LINE_KEYS: reward, accuracy, ...) are not the algorithm's headline (DPO's)


def warm_start_policy(run: RunSetup, logger: MetricsLogger) -> None:
    """algos/run/warm_start.py's warm start under a bar of its own, each step's metrics logged at step 0 (TensorBoard draws them
    at steps 1 - warm_start.steps .. 0: before RL's, out of reach of a resume's purge of the steps after its
    checkpoint); then the policy saved as the run's KL reference."""
    steps = run.config.warm_start.steps
    bar = logger.phase_bar(steps, "warm start")
    for step, metrics in enumerate(warm_start.warm_start(run), 1):
        logger.log(0, {"warm_start/step": step, **metrics}, tensorboard_step=step - steps)
        bar.set_postfix(loss=f"{metrics['warm_start/loss']:.3g}", refresh=False)
        bar.update()
    bar.close()
    warm_start.save_warm_started(run)


def held_out_evaluation(run: RunSetup, backend: RolloutBackend) -> Callable[[], dict[str, float]]:
    """The run's held-out evaluation, called before, during and after training -> {"eval_accuracy",
    "eval_accuracy_transfer" when env.transfer_eval_kwargs asks for it, and "eval_pass@k" and "eval_maj@N" of
    env.eval_samples = N samples a problem when N > 0}."""
    transfer_config = transfer_eval_config(run.config)  # env.transfer_eval_kwargs: the same problems, another prompt
    transfer_set = eval_task(transfer_config) if transfer_config is not None else None
    # a transfer prompt that asks what the main evaluation already asks (its examples are already gone) is not rerun
    transfer_is_main = transfer_set is not None and asks_the_same(run.config, run.eval_set, transfer_config, transfer_set)

    def held_out_accuracy() -> dict[str, float]:
        with whole_weights(run.forward):
            scores = {"eval_accuracy": evaluate(run.model, run.tokenizer, run.config, backend, device=run.device,
                                                eval_set=run.eval_set)}
            if transfer_is_main:
                scores["eval_accuracy_transfer"] = scores["eval_accuracy"]
            elif transfer_config is not None:
                scores["eval_accuracy_transfer"] = evaluate(run.model, run.tokenizer, transfer_config, backend,
                                                            device=run.device, eval_set=transfer_set)
            if samples := run.config.env.eval_samples:
                sampled = evaluate_sampled(run.model, run.tokenizer, run.config, backend, device=run.device,
                                           eval_set=run.eval_set, samples=samples)
                scores.update({f"eval_{name}": value for name, value in sampled.items()})
        return scores

    return held_out_accuracy


def before_training(run: RunSetup, logger: MetricsLogger, held_out_accuracy: Callable[[int], dict[str, float]]) -> dict:
    """A fresh run's step 0: the held-out accuracy before, then the warm start (warm_start.steps) and the accuracy
    after it -> the summary's *_before and *_warm_start entries."""
    scores = held_out_accuracy(0)
    summary = {f"{key}_before": value for key, value in scores.items()}
    # The first record says how the run ran (config.yaml records it too; a resume may run on another number of ranks).
    strategy = run.config.distributed.strategy if run.world.size > 1 else "none"
    logger.log(0, {**scores, "world_size": run.world.size, "distributed_strategy": strategy})
    if run.config.warm_start.steps:
        # Only checkpoints (step >= 1, after it) keep the warm start: a run killed before its first one resumes at
        # step 0 and warms up again from the initial weights; one resumed from checkpoint-k holds warm-started
        # weights and skips it.
        warm_start_policy(run, logger)
        scores = {f"{key}_warm_start": value for key, value in held_out_accuracy(0).items()}
        summary.update(scores)
        logger.log(0, scores)
    return summary


def batch_wait_s(metrics: dict[str, float]) -> float:
    """Of a step's wall time, the part it spent getting its batch: drawing it (time/rollout_s, a synchronous run) or
    waiting for the actor that drew it ahead (async/learner_wait_s, rollout.max_staleness >= 1 or split mode)."""
    return metrics.get("time/rollout_s", metrics.get("async/learner_wait_s", 0.0))


def timed(held_out_accuracy: Callable[[int], dict[str, float]], step: int) -> tuple[dict[str, float], float]:
    """A held-out evaluation's scores, and its wall time in seconds (logged as time/eval_s)."""
    started = time.perf_counter()
    scores = held_out_accuracy(step)
    return scores, time.perf_counter() - started


def run_training(agent: Agent) -> dict[str, Any]:
    """The loop every agent shares: held-out eval before (fresh runs) and after (eval_accuracy, and
    eval_accuracy_transfer under env.transfer_eval_kwargs' prompt when set), with a fresh run's warm start
    (warm_start.steps) and an eval after it (eval_accuracy_warm_start) in between; `run.steps` steps
    from `agent.start_step`, each under env.schedule's task config for it, metrics logged each step,
    checkpoints every `run.save_every` and at the end, curves plotted; under model.autocast's mixed precision
    when set. Every rank runs it; rank 0 logs. The agent's rollouts are closed however it ends."""
    try:
        return _training_loop(agent)
    finally:
        agent.rollouts.close()  # its rollout threads and servers end with the run, on errors too


def _training_loop(agent: Agent) -> dict[str, Any]:
    run, cfg = agent.run, agent.run.config.run
    if run.world.rollout_rank is not None:  # split mode: this process only draws the learner's batches
        with mixed_precision(run.config.model, run.device):
            agent.rollouts.serve()
        return {"output_dir": str(run.output_dir)}
    evaluate_policy = held_out_evaluation(run, agent.backend)
    logger_type = MetricsLogger if run.world.is_main else SilentLogger
    logger = logger_type(run.output_dir, cfg.steps, start_step=agent.start_step, tensorboard=cfg.tensorboard,
                         progress=cfg.progress, headline=getattr(agent, "headline_metrics", None))
    best = BestModel(run, resumed=agent.start_step > 0)

    def held_out_accuracy(step: int) -> dict[str, float]:  # each evaluation's policy may be the best model yet
        scores = evaluate_policy()
        if (saved := best.offer(step, scores)) is not None:
            logger.write(f"step {step}: best {saved['metric']} yet, {saved['value']:.3g}: policy saved to best_model/")
        return scores
    summary: dict[str, Any] = {"output_dir": str(run.output_dir)}
    monitor = HealthMonitor(run.config.alarms)
    step = agent.start_step
    try:
        with mixed_precision(run.config.model, run.device):
            if agent.start_step == 0:
                summary.update(before_training(run, logger, held_out_accuracy))
            for step in range(agent.start_step + 1, cfg.steps + 1):
                started = time.perf_counter()
                metrics = agent.train_step(step, logger)
                metrics["time/update_s"] = time.perf_counter() - started - batch_wait_s(metrics)
                # env.schedule: the task config this step's batch was drawn under (RunSetup.sample sets it)
                metrics.update({f"schedule/{key}": value for key, value in run.schedule.at(step).items()})
                if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.steps:
                    scores, metrics["time/eval_s"] = timed(held_out_accuracy, step)
                    metrics.update(scores)
                metrics["step_time_s"] = time.perf_counter() - started
                if step == cfg.steps:
                    scores, metrics["time/eval_s"] = timed(held_out_accuracy, step)
                    metrics.update(scores)
                    summary.update({f"{key}_after": value for key, value in scores.items()})
                alarms = monitor.check(step, metrics)  # every rank sees the same (global) metrics and decides alike
                for alarm in alarms:
                    metrics[f"alarm/{alarm.name}"] = 1.0
                    logger.write(f"alarm: {alarm.message}")
                logger.log(step, metrics)
                stopping = bool(alarms) and cfg.stop_on_alarm and step != cfg.steps
                if step == cfg.steps or stopping or (cfg.save_every and step % cfg.save_every == 0):
                    agent.save(step)
                if stopping:
                    summary["stopped_by_alarm"] = ", ".join(alarm.name for alarm in alarms)
                    logger.write(f"stopped at step {step} by run.stop_on_alarm; checkpoint-{step} holds it")
                    break
    except KeyboardInterrupt as interrupt:  # Ctrl-C: say where the run stands (the CLI prints only this line)
        logger.close(plot=cfg.plots)  # the curves of the steps it did
        last = latest_checkpoint(run.output_dir)
        where = f"{last.name} is the last checkpoint; --resume continues from it" if last else "no checkpoint was saved yet"
        raise KeyboardInterrupt(f"interrupted during step {step}; {where}") from interrupt
    if best.best is not None:
        summary["best_model"] = {"path": str(run.output_dir / BEST_MODEL_DIR), **best.best}
    summary["plot"] = logger.close(plot=cfg.plots)
    return summary

