"""The zero-shot transfer toolkit (issue 18): env.schedule (rlvr_env.curriculum.StepSchedule), few_shot_keep,
env.transfer_eval_kwargs -> eval_accuracy_transfer, `rlvr eval --zero-shot`, and the recipes in examples/recipes/
that use them (they load, validate and run a step or two on a tiny model; their full runs are not tested here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from algos.algorithms import grpo
from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config
from algos.run.directory import check_resumable
from algos.run.evaluation import asks_the_same, eval_task, evaluate_saved_model, transfer_eval_config, zero_shot
from algos.run.reporting import read_metrics, without_wall_times
from rlvr_cli import main
from rlvr_env import make_task
from rlvr_env.curriculum import StepSchedule
from rlvr_env.testing import build_char_tokenizer, build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
ARITHMETIC_RECIPE = ROOT / "examples/recipes/arithmetic_zero_shot.toml"
GSM8K_RECIPE = ROOT / "examples/recipes/gsm8k_zero_shot.toml"
GSM8K_SAMPLE = ROOT / "tests/data/gsm8k_sample.jsonl"
FEW_SHOT = [["1+2=", "3"], ["4+4=", "8"], ["2+5=", "7"]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ---------------------------------------------------------------- StepSchedule


def test_a_schedule_is_linear_between_its_steps_and_constant_outside():
    schedule = StepSchedule({"few_shot_keep": {"from": 1.0, "to": 0.0, "start_step": 10, "end_step": 30},
                             "digits": {"from": 1, "to": 3, "end_step": 4}})
    assert [schedule.at(s)["few_shot_keep"] for s in (0, 10, 15, 20, 30, 99)] == [1.0, 1.0, 0.75, 0.5, 0.0, 0.0]
    assert [schedule.at(s)["digits"] for s in range(6)] == [1, 2, 2, 2, 3, 3]  # integer ends: rounded (half to even)
    assert all(isinstance(schedule.at(s)["digits"], int) for s in range(6))
    assert schedule.at(15) == schedule.at(15)  # a pure function of the step
    assert not StepSchedule({}) and schedule


@pytest.mark.parametrize(("ramps", "message"), [
    ({"format_weight": 0.1}, "env.schedule.format_weight must be a mapping"),
    ({"format_weight": {"from": 0.1, "to": 0.0}}, "env.schedule.format_weight: missing end_step"),
    ({"format_weight": {"from": 0.1, "to": 0.0, "end_step": 5, "stop": 3}}, "unknown key 'stop'"),
    ({"format_weight": {"from": "0.1", "to": 0.0, "end_step": 5}}, "env.schedule.format_weight.from must be a finite"),
    ({"format_weight": {"from": 0.1, "to": 0.0, "end_step": 5, "start_step": 5}}, "end_step must be > start_step"),
    ({"format_weight": {"from": 0.1, "to": 0.0, "end_step": 2.5}}, "env.schedule.format_weight.end_step must be an integer"),
])
def test_a_bad_ramp_is_refused_by_name(ramps, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        StepSchedule(ramps, "env.schedule")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("env.schedule", "{few_shot_kept: {from: 1, to: 0, end_step: 4}}", "config env.schedule .*no field 'few_shot_kept'"),
    ("env.schedule", "{format_weight: {from: 0.1, to: -0.1, end_step: 4}}", "config env.schedule .*format_weight must be >= 0"),
    ("env.schedule", "{few_shot_keep: {from: 1.5, to: 0, end_step: 4}}", "few_shot_keep must be a number in"),
    ("env.schedule", "{format_weight: {from: 0.1, end_step: 4}}", "config env.schedule.format_weight: missing to"),
    ("env.transfer_eval_kwargs", "{few_shots: []}", "config env.transfer_eval_kwargs .*no field 'few_shots'"),
])
def test_the_config_refuses_a_schedule_or_transfer_prompt_the_task_cannot_take(key, value, message):
    with pytest.raises(ValueError, match=message):
        load_config(GRPOConfig, overrides={key: value})


# ---------------------------------------------------------------- few_shot_keep


def test_few_shot_keep_shows_each_example_by_a_per_problem_draw_that_only_shrinks_as_it_falls():
    task = make_task("Arithmetic", few_shot=FEW_SHOT)
    problems = [task.problem(i, 0) for i in range(400)]
    shown = {}
    for keep in (1.0, 0.7, 0.4, 0.0):
        task.configure(few_shot_keep=keep)
        shown[keep] = [[turn["content"] for turn in task.messages(p)[:-1:2]] for p in problems]
        assert shown[keep] == [[turn["content"] for turn in task.messages(p)[:-1:2]] for p in problems]  # repeatable
        mean = sum(map(len, shown[keep])) / len(problems)
        assert mean == pytest.approx(3 * keep, abs=0.15)
    assert all(examples == [q for q, _ in FEW_SHOT] for examples in shown[1.0])
    assert all(examples == [] for examples in shown[0.0])
    for high, low in ((1.0, 0.7), (0.7, 0.4), (0.4, 0.0)):
        assert all(set(b) <= set(a) for a, b in zip(shown[high], shown[low]))  # kept examples keep their order too
    assert task.messages(problems[0])[-1] == {"role": "user", "content": problems[0].prompt}


VARIANTS = ["Calculate {expression}.", "Work out {expression}, and box the result: \\boxed{{}}."]


def test_a_problem_is_reworded_by_a_per_problem_draw_that_keeps_its_numbers_and_only_grows_with_the_chance():
    """prompt_variants / prompt_variant_chance: each problem is asked in one of the variants with this chance (which
    one, drawn too), its numbers and answer as prompt_template's; a reworded problem keeps its wording as the chance
    rises; 0 (the default) is the task as before."""
    plain = make_task("Arithmetic", kinds=[{"operators": "+"}, {"terms": 3, "operators": "+-"}])
    asked = {}
    for chance in (0.0, 0.3, 0.6, 1.0):
        task = make_task("Arithmetic", kinds=[{"operators": "+"}, {"terms": 3, "operators": "+-"}],
                         prompt_variants=VARIANTS, prompt_variant_chance=chance)
        problems = [task.problem(i, 7) for i in range(400)]
        assert [(p.answer, p.metadata) for p in problems] == [(q.answer, q.metadata) for q in
                                                             (plain.problem(i, 7) for i in range(400))]
        assert [p.prompt for p in problems] == [task.problem(i, 7).prompt for i in range(400)]  # repeatable
        wordings = [next((v for v in VARIANTS if p.prompt == v.format(expression=p.metadata["expression"])), None)
                    for p in problems]
        asked[chance] = wordings
        assert sum(w is not None for w in wordings) / 400 == pytest.approx(chance, abs=0.06)
    assert all(p.prompt == q.prompt for p, q in zip((plain.problem(i, 7) for i in range(400)),
                                                      (make_task("Arithmetic", kinds=plain.config.kinds,
                                                                 prompt_variants=VARIANTS).problem(i, 7)
                                                       for i in range(400))))
    assert set(asked[1.0]) == set(VARIANTS)  # both wordings drawn
    for low, high in ((0.0, 0.3), (0.3, 0.6), (0.6, 1.0)):
        assert all(w_low is None or w_low == w_high for w_low, w_high in zip(asked[low], asked[high]))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prompt_variant_chance": 0.5}, "prompt_variant_chance = 0.5 rewords problems, but prompt_variants is empty"),
    ({"prompt_variants": VARIANTS, "prompt_variant_chance": 1.5}, r"prompt_variant_chance must be a number in \[0, 1\]"),
    ({"prompt_variants": ["Calculate it."]}, r"prompt_variants\[0\]: prompt_template must contain \{expression\}"),
    ({"prompt_variants": "Calculate {expression}."}, "prompt_variants must be a list of prompt templates"),
])
def test_bad_prompt_variants_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_task("Arithmetic", **kwargs)


def test_gsm8k_takes_few_shot_keep_too():
    task = make_task("GSM8K", data_path=str(GSM8K_SAMPLE), few_shot=FEW_SHOT, few_shot_keep=0.0)
    assert task.size == 12 and task.messages(task.problem(0, 0)) == [{"role": "user", "content": task.problem(0, 0).prompt}]
    task.configure(few_shot_keep=1.0)
    assert len(task.messages(task.problem(0, 0))) == 7


# ---------------------------------------------------------------- evaluation under another prompt


def test_zero_shot_and_transfer_configs_change_only_the_eval_prompt():
    config = load_config(GRPOConfig, ARITHMETIC_RECIPE)
    original = config.env.eval_kwargs.copy()
    zero = zero_shot(config)
    assert zero.env.eval_kwargs == {**original, "few_shot": []} and zero.env.use_chat_template is True
    assert zero.env.kwargs == config.env.kwargs and config.env.eval_kwargs == original  # the config is untouched
    assert transfer_eval_config(config).env.eval_kwargs == {**original, **config.env.transfer_eval_kwargs}
    assert config.env.transfer_eval_kwargs["few_shot"] == []
    plain = load_config(GRPOConfig, overrides={"env.use_chat_template": "false"})
    assert transfer_eval_config(plain) is None
    only_template = transfer_eval_config(load_config(GRPOConfig, overrides={"env.transfer_eval_chat_template": "false"}))
    assert only_template.env.use_chat_template is False and only_template.env.eval_kwargs == {}


def test_a_transfer_evaluation_that_asks_what_the_main_one_asks_is_not_run_twice():
    examples_removed = {"env.eval_size": "20", "env.transfer_eval_kwargs": "{few_shot: []}"}
    arithmetic = load_config(GRPOConfig, ARITHMETIC_RECIPE, examples_removed)

    def same(config):
        transfer = transfer_eval_config(config)
        return asks_the_same(config, eval_task(config), transfer, eval_task(transfer))

    assert same(arithmetic)  # its env.kwargs show no examples: removing them changes no prompt
    assert not same(load_config(GRPOConfig, ARITHMETIC_RECIPE, {"env.eval_size": "20"}))  # as written: other words
    assert not same(load_config(GRPOConfig, ARITHMETIC_RECIPE, {**examples_removed, "env.kwargs.few_shot_keep": "1.0"}))
    assert not same(load_config(GRPOConfig, ARITHMETIC_RECIPE, {  # the same prompts, scored another way
        "env.eval_size": "20", "env.transfer_eval_kwargs": "{few_shot: [], boxed_only: false}"}))
    assert not same(load_config(GRPOConfig, ARITHMETIC_RECIPE, {**examples_removed,
                                                              "env.transfer_eval_chat_template": "false"}))
    gsm8k = load_config(GRPOConfig, GSM8K_RECIPE, {"env.eval_size": "5"})  # few_shot_keep 1: the examples are shown
    assert not same(gsm8k)


def test_rlvr_eval_zero_shot_scores_the_bare_question_of_a_gsm8k_file(tiny_dir, tmp_path, capsys):
    """The GSM8K plumbing: a few-shot config, evaluated as written and with --zero-shot (the tiny random model
    scores ~0 either way; what is pinned is which prompt each scores)."""
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"env": {"id": "rlvr/GSM8K-v0", "max_new_tokens": 4, "eval_size": 12,
                                          "kwargs": {"data_path": str(GSM8K_SAMPLE), "few_shot": FEW_SHOT},
                                          "eval_kwargs": {"data_path": str(GSM8K_SAMPLE)}},
                                  "model": {"path": str(tiny_dir), "autocast": None}}))
    reports = []
    for flags in ([], ["--zero-shot"]):
        assert main(["eval", "--config", str(config), *flags]) == 0
        reports.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert [r["prompt"] for r in reports] == ["config", "zero-shot"] and all(r["problems"] == 12 for r in reports)

    from algos.model.loading import load_policy
    from algos.rollout import make_env
    from algos.run.evaluation import eval_task

    loaded = load_config(GRPOConfig, config)
    _, tokenizer = load_policy(str(tiny_dir))
    prompts = []
    for variant in (loaded, zero_shot(loaded)):
        task, indices = eval_task(variant)
        env = make_env(variant, tokenizer, num_envs=len(indices), device="cpu", task=task)
        env.reset(seed=0, options={"problem_indices": indices})
        prompts.append(tokenizer.batch_decode(env.input_ids[:, : env.prompt_width], skip_special_tokens=True))
    assert all("1+2=" in p for p in prompts[0]) and not any("1+2=" in p for p in prompts[1])
    assert all(few.endswith(zero) for few, zero in zip(prompts[0], prompts[1]))


# ---------------------------------------------------------------- recipes


@pytest.mark.parametrize("recipe", [ARITHMETIC_RECIPE, GSM8K_RECIPE], ids=lambda p: p.stem)
def test_a_recipe_loads_and_validates(recipe):
    config = load_config(GRPOConfig, recipe)
    assert config.model.path == "default" and config.env.schedule and config.env.transfer_eval_kwargs["few_shot"] == []
    assert config.env.use_chat_template
    schedule = StepSchedule(config.env.schedule)
    end = schedule.at(config.run.steps)
    assert end["few_shot_keep"] == 0.0  # trains zero-shot at the end
    if recipe == ARITHMETIC_RECIPE:  # only a boxed answer scores, and format credit is kept
        assert config.env.kwargs["boxed_only"] is True and "format_weight" not in end
    else:
        assert end["format_weight"] == 0.0
    task = make_task(config.env.id, **{**config.env.kwargs, **end})
    problem = task.problem(0, 0)
    # Once the examples are gone, a training prompt is exactly what --zero-shot evaluates.
    zero = make_task(config.env.id, **{**config.env.kwargs, **zero_shot(config).env.eval_kwargs})
    assert task.messages(problem) == zero.messages(problem) == [{"role": "user", "content": problem.prompt}]
    start = make_task(config.env.id, **{**config.env.kwargs, **schedule.at(1)})
    assert len(start.messages(problem)) == 2 * len(config.env.kwargs["few_shot"]) + 1
    # Every example is asked the way the task asks its own problems: dropping examples changes nothing else.
    template_tail = config.env.kwargs.get("prompt_template", task.config.prompt_template).rsplit("}", 2)[-1]
    assert all(question.endswith(template_tail.replace("{{}}", "{}")) for question, _ in config.env.kwargs["few_shot"])
    if recipe == ARITHMETIC_RECIPE:
        assert config.run.output_dir == "runs/arithmetic-zero-shot"
        # The warm start imitates demonstrations on env.kwargs' own prompt: the bare question, of every kind.
        assert config.warm_start.steps > 0
        unscheduled = make_task(config.env.id, **config.env.kwargs)
        assert unscheduled.messages(problem) == [{"role": "user", "content": problem.prompt}]
        assert len(config.env.kwargs["kinds"]) == 3
        # The transfer evaluation asks the same problems in words no training prompt uses (warm start, examples, RL)
        transfer = make_task(config.env.id, **{**config.env.kwargs, **transfer_eval_config(config).env.eval_kwargs})
        [asked] = transfer.messages(transfer.problem(0, 0))
        assert asked["content"] != problem.prompt and problem.metadata["expression"] in asked["content"]
        question = asked["content"].split(problem.metadata["expression"])[0]  # "Calculate "
        assert question and all(question not in text for pair in config.env.kwargs["few_shot"] for text in pair)
        assert not question.startswith(config.env.kwargs["prompt_template"].split("{")[0])
        assert transfer.config.prompt_template not in config.env.kwargs.get("prompt_variants", [])  # nor RL's wordings
        # RL asks most of its problems in those other wordings; the warm start and the evaluation ask env.kwargs' own
        assert end["prompt_variant_chance"] >= 0.5 and not config.env.kwargs.get("prompt_variant_chance")
        assert config.run.metric_for_best_model == "eval_accuracy"  # the own wording picks best_model, not the transfer


def tiny_recipe_overrides(tiny_dir, output_dir, **more):
    return {"model.path": str(tiny_dir), "model.autocast": "null", "env.eval_size": "4", "env.max_new_tokens": "4",
            "run.output_dir": str(output_dir), "run.progress": "false", "run.tensorboard": "false",
            "run.plots": "false", "run.save_every": "0", "run.eval_every": "2",
            "rollout.prompts_per_step": "2", "rollout.group_size": "2", "loss.micro_batch_size": "4", "warm_start.steps": "0",
            "grpo.overlong_cache": "2",  # the recipe's soft overlong penalty within these 4 tokens
            "env.kwargs.few_shot": json.dumps(FEW_SHOT),  # the recipe's worked examples overflow the tiny model's 512
            "env.schedule": "{few_shot_keep: {from: 1.0, to: 0.0, end_step: 4}, format_weight: {from: 0.1, to: 0.0, "
                            "start_step: 2, end_step: 4}}", **more}


def test_the_arithmetic_recipe_runs_scheduled_and_logs_the_transfer_accuracy(tiny_dir, tmp_path, monkeypatch):
    from algos.run import loop

    evaluations, evaluate = [], loop.evaluate
    monkeypatch.setattr(loop, "evaluate", lambda *args, **kwargs: evaluations.append(1) or evaluate(*args, **kwargs))
    config = load_config(GRPOConfig, ARITHMETIC_RECIPE, tiny_recipe_overrides(tiny_dir, tmp_path, **{
        "run.steps": "4", "env.transfer_eval_kwargs": "{few_shot: []}"}))  # the examples removed: nothing else
    summary = grpo.train(config)
    assert len(evaluations) == 3  # steps 0, 2 and 4, each once: the transfer prompt asks what the main one asks
    assert {"eval_accuracy_before", "eval_accuracy_transfer_before", "eval_accuracy_after",
            "eval_accuracy_transfer_after"} <= set(summary)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if "eval_accuracy_transfer" in r] == [0, 2, 4]
    # env.kwargs shows no examples (few_shot_keep 0), so removing them asks the same: one evaluation scores both
    assert all(r["eval_accuracy_transfer"] == r["eval_accuracy"] for r in records if "eval_accuracy" in r)
    assert [r["schedule/few_shot_keep"] for r in records[1:]] == [0.75, 0.5, 0.25, 0.0]
    assert [r["schedule/format_weight"] for r in records[1:]] == pytest.approx([0.1, 0.1, 0.05, 0.0])
    assert "reward/format" in records[1]


def test_a_transfer_prompt_that_asks_otherwise_is_evaluated_on_its_own_task(tiny_dir, tmp_path, monkeypatch):
    """env.transfer_eval_kwargs that change how an answer is read: every held-out evaluation scores the run's model on
    the main task, then on the transfer config's own task (built once), logged and summed up as
    eval_accuracy_transfer."""
    from algos.run import loop

    tasks = []

    def evaluate(model, tokenizer, config, backend, device, eval_set):
        task, _ = eval_set
        tasks.append(task)
        assert model is not None and tokenizer is not None and backend is not None and device.type == "cpu"
        assert config.env.eval_kwargs.get("fallback_last_number", True) == task.config.fallback_last_number
        return 0.25 if task.config.fallback_last_number else 0.75

    monkeypatch.setattr(loop, "evaluate", evaluate)
    summary = grpo.train(load_config(GRPOConfig, ARITHMETIC_RECIPE, tiny_recipe_overrides(tiny_dir, tmp_path, **{
        "run.steps": "2", "env.transfer_eval_kwargs": "{few_shot: [], fallback_last_number: false}"})))
    assert [task.config.fallback_last_number for task in tasks] == [True, False, True, False]
    assert tasks[1] is tasks[3] and not tasks[1].config.few_shot
    evaluated = [(r["step"], r["eval_accuracy"], r["eval_accuracy_transfer"]) for r in read_metrics(tmp_path)
                 if "eval_accuracy" in r]
    assert evaluated == [(0, 0.25, 0.75), (2, 0.25, 0.75)]
    assert (summary["eval_accuracy_after"], summary["eval_accuracy_transfer_after"]) == (0.25, 0.75)


def test_a_resumed_scheduled_run_repeats_the_uninterrupted_one(tiny_dir, tmp_path):
    def train(output_dir, steps, resume=False):
        config = load_config(GRPOConfig, ARITHMETIC_RECIPE,
                             tiny_recipe_overrides(tiny_dir, output_dir, **{"run.steps": str(steps)}))
        return grpo.train(config, resume=resume)

    train(tmp_path / "whole", 4)
    train(tmp_path / "cut", 2)
    train(tmp_path / "cut", 4, resume=True)

    assert without_wall_times(read_metrics(tmp_path / "cut")) == without_wall_times(read_metrics(tmp_path / "whole"))


def test_a_resume_may_change_the_transfer_prompt_but_not_the_schedule(tiny_dir, tmp_path):
    config = load_config(GRPOConfig, ARITHMETIC_RECIPE, tiny_recipe_overrides(tiny_dir, tmp_path, **{"run.steps": "1"}))
    grpo.train(config)
    checkpoint = tmp_path / "checkpoint-1"
    more = {"run.steps": "2"}
    check_resumable(load_config(GRPOConfig, ARITHMETIC_RECIPE, tiny_recipe_overrides(
        tiny_dir, tmp_path, **more, **{"env.transfer_eval_kwargs": "{few_shot: [], fallback_last_number: false}"})),
        checkpoint)
    changed = tiny_recipe_overrides(tiny_dir, tmp_path, **more)
    changed["env.schedule"] = "{few_shot_keep: {from: 1.0, to: 0.0, end_step: 8}}"
    with pytest.raises(ValueError, match="env.schedule"):
        check_resumable(load_config(GRPOConfig, ARITHMETIC_RECIPE, changed), checkpoint)


def test_the_tiny_few_shot_run_scores_both_prompts_from_a_saved_model(tiny_dir):
    config = load_config(GRPOConfig, ARITHMETIC_RECIPE, tiny_recipe_overrides(tiny_dir, "unused"))
    for variant in (config, zero_shot(config)):
        assert 0.0 <= evaluate_saved_model(variant, tiny_dir) <= 1.0
