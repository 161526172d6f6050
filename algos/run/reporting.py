"""Where training metrics go: JSONL every step, TensorBoard when installed, a live tqdm bar (or a line per step),
PNG curves at the end."""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

METRICS_FILE = "metrics.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
PLOT_FILE = "curves.png"
# Shown in the progress bar when present (short names keep the bar on one line).
PROGRESS_KEYS = {"reward_mean": "reward", "accuracy": "acc", "entropy": "ent", "kl": "kl", "eval_accuracy": "eval",
                 "eval_accuracy_transfer": "xfer"}
# One line per step where no live bar is shown (run.progress false, or stderr not a terminal: a cluster's log file),
# as TRL and verl print theirs: these keys, those the step logged, in this order.
LINE_KEYS = {"reward_mean": "reward", "accuracy": "acc", "kl": "kl", "entropy": "entropy", "completion_len_mean": "len",
             "truncation_rate": "trunc", "eval_accuracy": "eval", "warm_start/loss": "sft_loss", "step_time_s": "s"}
# An algorithm whose own headline metrics are none of these (DPO's loss and implicit rewards) names them in its trainer's
# ``headline_metrics`` (key -> short name): run_training's logger shows them first, in the line and in the bar.
# From this many points a curve is drawn faint with its moving mean on top.
SMOOTH_FROM = 50
# Curves drawn at the end (an interrupted run's too), in this order, when the run logged them.
PLOT_KEYS = (
    "reward_mean", "accuracy", "eval_accuracy", "eval_accuracy_transfer", "entropy", "kl", "clip_frac_low", "clip_frac_high",
    "grad_norm", "completion_len_mean", "truncation_rate", "zero_std_group_frac", "generation_rounds",
    "value_loss", "explained_variance",
)


def _json_safe(value: Any) -> Any:
    """Floats that JSON cannot hold (NaN, inf) become null; tensors/numpy scalars become floats."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def without_wall_times(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metrics records less their wall times (the metrics named *_s: step_time_s, time/*, async/*_wait_s...), the one
    thing two runs of the same seed log differently."""
    return [{key: value for key, value in record.items() if not key.endswith("_s")} for record in records]


def read_metrics(output_dir: str | Path, name: str = METRICS_FILE) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl (or its ``name``: COMPLETIONS_FILE), in order. A cut-off last line (a write
    that a full disk or a power loss stopped halfway) is skipped with a warning; a bad line before it is an error."""
    path = Path(output_dir) / name
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number < len(lines):
                raise ValueError(f"{path}: line {number} is not a JSON record ({error})") from None
            warnings.warn(f"{path}: skipping the cut-off last line {number}: {line[:80]!r}", stacklevel=2)
    return records


def step_line(step: int, total_steps: int, record: dict[str, Any], keys: dict[str, str] = LINE_KEYS) -> str:
    """``step 3/10 | reward 0.25 | acc 0.125 | ... | s 1.52``: the ``keys`` (LINE_KEYS) the record has, 3 significant
    digits."""
    parts = [f"step {step}/{total_steps}"]
    for key, short in keys.items():
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f"{short} {value:.3g}")
    return " | ".join(parts)


def rewrite_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """``path`` holding ``records`` only, written aside and renamed over it: a kill leaves either file whole."""
    partial = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with partial.open("w") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in records))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, path)


def rollout_records(rollout, rows: int | None = None) -> list[dict[str, Any]]:
    """One JSON-ready record for each of ``rollout``'s first ``rows`` rows (None: all): what the model wrote for which
    question and how it scored (``row``, ``group``, ``prompt``: the task's question, ``completion``, ``answer``,
    ``score``, ``status``, ``components``, ``truncated``)."""
    components = {name: values.tolist() for name, values in rollout.reward_components.items()}
    count = len(rollout.completions) if rows is None else min(rows, len(rollout.completions))
    return [{"row": row, "group": int(rollout.group_ids[row]), "prompt": rollout.problems[row].prompt,
             "completion": rollout.completions[row], "answer": rollout.problems[row].answer,
             "score": _json_safe(rollout.scores[row]), "status": rollout.statuses[row],
             "components": {name: _json_safe(values[row]) for name, values in components.items()},
             "truncated": bool(rollout.truncated[row])} for row in range(count)]


class CompletionLog:
    """completions.jsonl: the first ``rows`` rows of each step's first generation round, what the model wrote and how it
    scored (TRL's log_completions, verl's rollout_data_dir). The first step a process draws drops the records from it
    on, so a killed-and-resumed run, which draws those steps again from the same seeds, leaves the file an
    uninterrupted run writes."""

    def __init__(self, output_dir: str | Path, rows: int) -> None:
        self.path, self.rows, self._file = Path(output_dir) / COMPLETIONS_FILE, rows, None

    def write(self, step: int, rollout) -> None:
        """Records of ``rollout``'s (a Rollout of step ``step``) first rows."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            rewrite_jsonl(self.path, [r for r in read_metrics(self.path.parent, COMPLETIONS_FILE) if r["step"] < step])
            self._file = self.path.open("a")
        for record in rollout_records(rollout, self.rows):
            self._file.write(json.dumps({"step": step, **record}, default=str) + "\n")
        self._file.flush()


class MetricsLogger:
    """Logs one dict of scalars per step. Resuming at `start_step` drops records after it,
    so a killed-and-resumed run leaves the same metrics.jsonl as an uninterrupted one. ``headline``: the algorithm's
    own metrics (key -> short name), shown before PROGRESS_KEYS in the bar and before LINE_KEYS in the step line."""

    def __init__(
        self,
        output_dir: str | Path,
        total_steps: int,
        *,
        start_step: int = 0,
        tensorboard: bool = True,
        progress: bool = True,
        headline: dict[str, str] | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self._line_keys = {**(headline or {}), **LINE_KEYS}
        self._progress_keys = {**(headline or {}), **PROGRESS_KEYS}
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.output_dir / METRICS_FILE
        kept = [r for r in read_metrics(self.output_dir) if r.get("step", 0) <= start_step] if start_step else []
        rewrite_jsonl(self.path, kept)
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is an optional extra
                pass
            else:
                self._tb = SummaryWriter(log_dir=str(self.output_dir / "tensorboard"), purge_step=start_step + 1)
        # A bar only on a terminal: in a log file its carriage returns make one endless line.
        bar = progress and sys.stderr.isatty()
        self._bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True, disable=not bar)
        self._total_steps = total_steps

    def log(self, step: int, metrics: dict[str, Any], tensorboard_step: int | None = None) -> None:
        """One record at ``step``; TensorBoard draws it at ``tensorboard_step`` when given (the warm start's steps)."""
        record = {"step": step, **{k: _json_safe(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step if tensorboard_step is None else tensorboard_step)
        if self._bar.disable:
            print(step_line(step, self._total_steps, record, self._line_keys), file=sys.stderr, flush=True)
            return
        shown = {short: record[key] for key, short in self._progress_keys.items() if record.get(key) is not None}
        self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
        self._bar.update(max(0, step - self._bar.n))

    def write(self, message: str) -> None:
        """A line of text that does not break the progress bar (stderr, as the bar and the step lines)."""
        self._bar.write(message, file=sys.stderr)

    def phase_bar(self, total: int, desc: str) -> tqdm:
        """A bar of its own for work before the first step (the warm start), shown when the run's is."""
        return tqdm(total=total, desc=desc, dynamic_ncols=True, leave=False, disable=self._bar.disable)

    def close(self, plot: bool = True) -> Path | None:
        """Flush everything; draw the curves when `plot`. Returns the PNG path (or None)."""
        self._bar.close()
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        return plot_metrics(self.output_dir) if plot else None


class SilentLogger:
    """What ranks other than 0 log through: nothing (rank 0 writes the run's metrics, bar and plots)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def log(self, step: int, metrics: dict[str, Any], tensorboard_step: int | None = None) -> None:
        pass

    def write(self, message: str) -> None:
        pass

    def phase_bar(self, total: int, desc: str) -> tqdm:
        return tqdm(total=total, disable=True)

    def close(self, plot: bool = True) -> None:
        return None


def moving_mean(values: tuple[float, ...], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    sums, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        sums.append(total / min(index + 1, window))
    return sums


def plot_metrics(output_dir: str | Path, keys: tuple[str, ...] = PLOT_KEYS) -> Path | None:
    """Draw each logged key of metrics.jsonl against step into one PNG; None when nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = read_metrics(output_dir)
    series = {}
    for key in keys:
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if points:
            series[key] = points
    if not series:
        return None
    cols = min(3, len(series))
    rows = math.ceil(len(series) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3 * rows), squeeze=False)
    for ax, (key, points) in zip(axes.flat, series.items()):
        steps, values = zip(*points)
        if len(steps) < SMOOTH_FROM:
            ax.plot(steps, values, marker=".")
        else:  # noisy per-step values faint, their moving mean on top (TensorBoard's smoothing, as a window)
            ax.plot(steps, values, alpha=0.3, linewidth=0.8)
            ax.plot(steps, moving_mean(values, max(2, len(values) // 20)), linewidth=1.5, color="C0")
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 0.5 ticks on a short run
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series):]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(output_dir) / PLOT_FILE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
