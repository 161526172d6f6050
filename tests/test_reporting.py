"""algos/run/reporting.py against hand-computed values: reading a run's metrics.jsonl (a cut-off last line is skipped,
a bad line before it is an error), the JSON-safe values it writes, a resume's truncation, the step line or the live bar,
and the curves' PNG: which panels, in which order, with which points and moving mean."""

import io
import json
import math
import sys

import pytest
import torch

from algos.run.reporting import (
    METRICS_FILE,
    PLOT_FILE,
    SMOOTH_FROM,
    MetricsLogger,
    _json_safe,
    moving_mean,
    plot_metrics,
    read_metrics,
)


def write_lines(directory, *lines):
    (directory / METRICS_FILE).write_text("\n".join(lines) + "\n")


def test_a_run_without_metrics_reads_as_no_records(tmp_path):
    assert read_metrics(tmp_path) == []


def test_a_cut_off_last_line_is_skipped_with_a_warning_that_names_it(tmp_path):
    write_lines(tmp_path, json.dumps({"step": 1}), "", json.dumps({"step": 2}), '{"step": 3, "lo')
    with pytest.warns(UserWarning, match=r"skipping the cut-off last line 3: '\{\"step\": 3, \"lo'"):
        assert read_metrics(tmp_path) == [{"step": 1}, {"step": 2}]  # the blank line is no record


def test_a_bad_line_before_the_last_is_an_error_that_names_it(tmp_path):
    write_lines(tmp_path, json.dumps({"step": 1}), "not json", json.dumps({"step": 3}))
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not a JSON record"):
        read_metrics(tmp_path)


def test_values_json_cannot_hold_become_null_and_tensors_floats():
    assert _json_safe(math.nan) is None and _json_safe(-math.inf) is None
    assert _json_safe(torch.tensor(2.5)) == 2.5 and isinstance(_json_safe(torch.tensor(2.5)), float)
    assert _json_safe(torch.tensor(float("nan"))) is None
    assert _json_safe(3) == 3 and _json_safe("ok") == "ok"


@pytest.mark.parametrize(("window", "means"), [(1, [1, 2, 6, 4]), (2, [1, 1.5, 4, 5]), (3, [1, 1.5, 3, 4])])
def test_the_moving_mean_averages_each_value_with_the_ones_before_it(window, means):
    assert moving_mean((1.0, 2.0, 6.0, 4.0), window) == pytest.approx(means)


def test_the_logger_writes_json_safe_records_and_tensorboard_and_a_resume_forgets_later_steps(tmp_path):
    logger = MetricsLogger(tmp_path, total_steps=3, tensorboard=True, progress=False)
    for step in (1, 2, 3):
        logger.log(step, {"reward_mean": step / 3, "entropy": torch.tensor(1.0 / step), "kl": float("nan")})
    assert logger.close() == tmp_path / PLOT_FILE and (tmp_path / PLOT_FILE).stat().st_size > 0
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["kl"] is None and records[2]["entropy"] == pytest.approx(1 / 3)
    assert any((tmp_path / "tensorboard").iterdir())
    # Resuming from step 2 forgets step 3, which the new run will log again; a cut-off line goes with it.
    with (tmp_path / METRICS_FILE).open("a") as fh:
        fh.write('{"step": 4, "rew')
    with pytest.warns(UserWarning, match="cut-off last line 4"):
        MetricsLogger(tmp_path, total_steps=3, start_step=2, tensorboard=False, progress=False).close(plot=False)
    assert [json.loads(line)["step"] for line in (tmp_path / METRICS_FILE).read_text().splitlines()] == [1, 2]
    assert not list(tmp_path.glob(f".{METRICS_FILE}.tmp-*"))  # written aside, then renamed over the file


def test_a_fresh_run_starts_an_empty_metrics_file_over_an_old_one(tmp_path):
    write_lines(tmp_path, json.dumps({"step": 0, "eval_accuracy": 0.5}), json.dumps({"step": 1}))  # step 0: before RL
    assert MetricsLogger(tmp_path, total_steps=3, tensorboard=False, progress=False).close(plot=False) is None
    assert (tmp_path / METRICS_FILE).read_text() == "" and not (tmp_path / PLOT_FILE).exists()


def test_the_logger_makes_its_run_directory_and_by_default_writes_tensorboard(tmp_path):
    run_dir = tmp_path / "runs" / "new"
    logger = MetricsLogger(run_dir, total_steps=2)
    logger.log(1, {"reward_mean": 0.5})
    assert logger.close(plot=False) is None and not (run_dir / PLOT_FILE).exists()  # no curves when told so
    assert read_metrics(run_dir) == [{"step": 1, "reward_mean": 0.5}] and any((run_dir / "tensorboard").iterdir())


def tensorboard_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_gets_each_numeric_metric_and_a_resume_replaces_the_steps_after_it(tmp_path):
    logger = MetricsLogger(tmp_path, total_steps=3, progress=False)
    for step in (1, 2, 3):
        logger.log(step, {"reward_mean": step / 10, "skipped_update": False, "note": "text", "kl": None})
    logger.close(plot=False)
    resumed = MetricsLogger(tmp_path, total_steps=3, start_step=2, progress=False)
    resumed.log(3, {"reward_mean": 0.9})
    resumed.close(plot=False)
    # the step itself, flags, text and nulls are no curves; step 3's first value is purged, not drawn beside the new
    assert tensorboard_scalars(tmp_path) == {"reward_mean": [(1, 0.1), (2, 0.2), (3, 0.9)]}


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, as a user's shell is (pytest's is not)."""

    def isatty(self):
        return True


STEP_3 = {"reward_mean": 0.25, "accuracy": 0.125, "kl": 0.00123456, "entropy": 4.6, "completion_len_mean": 12.25,
          "step_time_s": 1.519, "clip_frac_low": 0.5, "skipped_update": True, "eval_accuracy": None}


@pytest.mark.parametrize("terminal", [False, True], ids=["log-file", "terminal-without-progress"])
def test_without_a_live_bar_each_step_is_one_line_on_stderr(tmp_path, capsys, monkeypatch, terminal):
    """run.progress false, or stderr not a terminal (a cluster's log): one line per step, as TRL and verl print: the
    LINE_KEYS the step logged with numbers, in their order, 3 significant digits."""
    if terminal:
        monkeypatch.setattr(sys, "stderr", Terminal())
    logger = MetricsLogger(tmp_path, total_steps=10, tensorboard=False, progress=not terminal)
    logger.log(3, STEP_3)
    logger.write("alarm: something")
    assert logger.phase_bar(5, "warm start").disable  # no bar of its own either
    logger.close(plot=False)
    out, err = capsys.readouterr()
    assert out == ""  # stdout stays the command's JSON summary alone
    err = sys.stderr.getvalue() if terminal else err
    assert err.splitlines() == ["step 3/10 | reward 0.25 | acc 0.125 | kl 0.00123 | entropy 4.6 | len 12.2 | s 1.52",
                                "alarm: something"]


def test_an_algorithms_headline_metrics_lead_its_step_line(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, total_steps=4, tensorboard=False, progress=False,
                           headline={"dpo/loss": "loss", "accuracy": "acc"})
    logger.log(1, {"reward_mean": 1.0, "accuracy": 0.5, "dpo/loss": 0.69})
    logger.close(plot=False)
    assert capsys.readouterr().err == "step 1/4 | loss 0.69 | acc 0.5 | reward 1\n"  # the headline first, in its order


def test_on_a_terminal_the_live_bar_shows_the_headline_then_progress_keys_and_prints_no_step_lines(tmp_path,
                                                                                                    monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    logger = MetricsLogger(tmp_path, total_steps=10, start_step=2, tensorboard=False, progress=True,
                           headline={"dpo/loss": "loss"})
    logger.log(3, {**STEP_3, "dpo/loss": 0.5, "eval_accuracy_transfer": 0.75})
    assert logger._bar.n == 3  # resumed at 2, one step on
    logger.write("alarm: something")
    with logger.phase_bar(5, "warm start") as phase:
        assert (phase.disable, phase.total, phase.desc, phase.leave) == (False, 5, "warm start", False)
        assert phase.dynamic_ncols  # tqdm keeps the terminal's width reader here
    logger.close(plot=False)
    shown = terminal.getvalue()
    assert "step 3/10" not in shown and "alarm: something\n" in shown
    last = shown.split("\r")[-1]  # the bar's final state, drawn on close
    assert last.startswith("train:  30%") and "3/10" in last
    assert "loss=0.5, reward=0.25, acc=0.125, ent=4.6, kl=0.00123, xfer=0.75]" in last  # eval None: not shown


def capture_figures(monkeypatch):
    """The figures plot_metrics draws, kept open for inspection (it closes each after saving)."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    return figures


def test_the_curves_are_one_panel_per_logged_key_in_plot_order_with_their_steps(tmp_path, monkeypatch):
    figures = capture_figures(monkeypatch)
    write_lines(tmp_path, *(json.dumps(record) for record in [
        {"step": 1, "kl": 0.5, "reward_mean": 0.0, "grad_norm": None},
        {"step": 2, "kl": 0.25, "reward_mean": 0.5, "warm_start/loss": 2.0, "eval_accuracy": 0.4},
        {"step": 3, "kl": "n/a", "reward_mean": 1.0},
    ]))
    assert plot_metrics(tmp_path) == tmp_path / PLOT_FILE and (tmp_path / PLOT_FILE).is_file()
    (figure,) = figures
    assert tuple(figure.get_size_inches()) == (3 * 4.5, 1 * 3)  # three panels: one row of three columns
    panels = figure.axes
    assert [ax.get_title() for ax in panels] == ["reward_mean", "eval_accuracy", "kl"]  # PLOT_KEYS' order
    assert all(ax.get_xlabel() == "step" for ax in panels)
    (reward,) = panels[0].get_lines()  # under SMOOTH_FROM points: one line, each point marked
    assert reward.get_xdata().tolist() == [1, 2, 3] and reward.get_ydata().tolist() == [0.0, 0.5, 1.0]
    assert reward.get_marker() == "."
    assert panels[1].get_lines()[0].get_xdata().tolist() == [2]
    assert panels[2].get_lines()[0].get_xdata().tolist() == [1, 2]  # a null or a string is no point
    assert all(tick.is_integer() for tick in panels[0].get_xticks())  # whole steps only


@pytest.mark.parametrize(("points", "lines"), [(SMOOTH_FROM - 1, 1), (SMOOTH_FROM, 2)])
def test_from_50_points_on_a_curve_is_smoothed(tmp_path, monkeypatch, points, lines):
    figures = capture_figures(monkeypatch)
    write_lines(tmp_path, *(json.dumps({"step": step, "kl": step % 3}) for step in range(1, points + 1)))
    plot_metrics(tmp_path)
    drawn = figures[0].axes[0].get_lines()
    assert len(drawn) == lines
    if lines == 2:  # 50 // 20 = 2
        assert drawn[1].get_ydata().tolist() == pytest.approx(moving_mean(tuple(float(s % 3) for s in range(1, 51)), 2))


def test_past_50_points_a_curve_is_faint_under_its_moving_mean_and_spare_grid_cells_are_blank(tmp_path, monkeypatch):
    figures = capture_figures(monkeypatch)
    steps = range(11, 71)  # 60 points from step 11 (a resumed run's): a window of 60 // 20 = 3
    values = [step % 7 / 7 for step in steps]
    write_lines(tmp_path, *(json.dumps({"step": s, "reward_mean": v, "accuracy": v, "entropy": 1.0, "kl": 0.0})
                            for s, v in zip(steps, values)))
    plot_metrics(tmp_path)
    (figure,) = figures
    assert tuple(figure.get_size_inches()) == (3 * 4.5, 2 * 3)  # four panels: two rows of three
    assert [ax.get_title() for ax in figure.axes] == ["reward_mean", "accuracy", "entropy", "kl", "", ""]
    assert [ax.axison for ax in figure.axes] == [True, True, True, True, False, False]
    raw, mean = figure.axes[0].get_lines()
    assert raw.get_alpha() == 0.3 and raw.get_ydata().tolist() == values
    assert raw.get_xdata().tolist() == list(steps) and mean.get_xdata().tolist() == list(steps)
    assert mean.get_ydata().tolist() == pytest.approx(moving_mean(tuple(values), 3))
    assert mean.get_ydata()[2] == pytest.approx(sum(values[:3]) / 3)


def test_a_run_that_logged_none_of_the_plotted_keys_draws_nothing(tmp_path):
    write_lines(tmp_path, json.dumps({"step": 1, "warm_start/loss": 2.0}))
    assert plot_metrics(tmp_path) is None and not (tmp_path / PLOT_FILE).exists()
    assert plot_metrics(tmp_path, keys=("warm_start/loss",)) == tmp_path / PLOT_FILE


def scored_rollout(step: int, rows: int = 3):
    """A rollout's fields that rollout_records reads, each row's values telling its step and row apart."""
    from fractions import Fraction
    from types import SimpleNamespace

    from rlvr_env import Problem

    return SimpleNamespace(
        completions=[f"step {step} row {row}" for row in range(rows)],
        problems=[Problem(f"question {row // 2}", Fraction(step, row + 1)) for row in range(rows)],
        group_ids=torch.arange(rows) // 2, scores=torch.tensor([1.0, float("nan"), 0.5][:rows]),
        statuses=["ok", "error", "ok"][:rows], reward_components={"correct": torch.tensor([1.0, 0.0, 0.5][:rows])},
        truncated=torch.tensor([False, True, False][:rows]))


def test_completions_log_writes_each_rows_record_and_a_resume_redraws_from_its_first_step(tmp_path):
    from algos.run.reporting import COMPLETIONS_FILE, CompletionLog, read_metrics, rollout_records

    assert [r["row"] for r in rollout_records(scored_rollout(1))] == [0, 1, 2]  # every row, unless told how many

    first = CompletionLog(tmp_path / "run" / "nested", rows=2)  # its directory made on the first write
    for step in (1, 2, 3):
        first.write(step, scored_rollout(step))
    written = read_metrics(tmp_path / "run" / "nested", COMPLETIONS_FILE)
    assert written[:2] == [
        {"step": 1, "row": 0, "group": 0, "prompt": "question 0", "completion": "step 1 row 0", "answer": "1",
         "score": 1.0, "status": "ok", "components": {"correct": 1.0}, "truncated": False},
        {"step": 1, "row": 1, "group": 0, "prompt": "question 0", "completion": "step 1 row 1", "answer": "1/2",
         "score": None, "status": "error", "components": {"correct": 0.0}, "truncated": True},
    ]  # the first 2 rows; an answer JSON cannot hold as its text, a NaN score as null
    assert [r["step"] for r in written] == [1, 1, 2, 2, 3, 3]
    resumed = CompletionLog(tmp_path / "run" / "nested", rows=2)  # a run resumed from step 1's checkpoint
    resumed.write(2, scored_rollout(2))
    assert read_metrics(tmp_path / "run" / "nested", COMPLETIONS_FILE) == written[:4]
