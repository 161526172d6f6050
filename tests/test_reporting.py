"""algos/run/reporting.py's pure parts, against hand-computed values: reading a run's metrics.jsonl (a cut-off last
line is skipped, a bad line before it is an error), the JSON-safe values it writes, the curves' moving mean."""

import json
import math

import pytest
import torch

from algos.run.reporting import METRICS_FILE, _json_safe, moving_mean, read_metrics


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
