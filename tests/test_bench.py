"""The benches the GPU calls run (bench/gpu_checks.sh, bench/gpu_shapes.sh), checked here on the CPU so that a lent
GPU's few minutes are never spent on a renamed flag, test or config key: every command line in those scripts parses,
the published shapes have their model cards' sizes, and each bench runs end to end on a tiny model and prints its
table."""

import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
GPU_SCRIPTS = ("gpu_checks.sh", "gpu_shapes.sh")
SHELL_ENDS = ("|", ">", "2>", "&")  # where a bench's own arguments end on a script's line


@pytest.fixture
def bench(monkeypatch):
    """Imports bench/NAME.py as the scripts run it (bench/ on sys.path: profile_step imports gpu_busy)."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module


def script_commands(script: str) -> list[list[str]]:
    """Each command line of a GPU script (continued lines joined), split as the shell splits it; gpu_shapes.sh's
    ``row NAME LIMIT ARGS`` lines as the grpo_step.py commands they run."""
    text = (BENCH / script).read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if line.lstrip().startswith("#") or line.startswith("row()"):  # row()'s body runs the rows' "$@"
            continue
        if line.startswith("row "):
            commands.append(["python3", "bench/grpo_step.py", *shlex.split(line)[3:]])
        elif "python3 " in line:
            words = shlex.split(line[line.index("python3 "):])
            ends = [i for i, word in enumerate(words) if word.startswith(SHELL_ENDS)]
            commands.append(words[: ends[0]] if ends else words)
    return commands


def bench_commands():
    commands = [command for script in GPU_SCRIPTS for command in script_commands(script)]
    return [c for c in commands if c[1].startswith("bench/")]


def test_the_gpu_scripts_have_the_commands_this_test_reads():
    """The parser below found every bench the scripts run: a change to their layout cannot empty the checks."""
    assert sorted({Path(c[1]).stem for c in bench_commands()}) == ["grpo_step", "overlap", "profile_step", "rollout"]
    assert len([c for c in bench_commands() if c[1] == "bench/grpo_step.py"]) == 4  # gpu_checks' one, three rows


@pytest.mark.parametrize("command", bench_commands(), ids=lambda c: " ".join(c[1:4]))
def test_every_bench_command_in_the_gpu_scripts_takes_its_flags(bench, command):
    module = bench(Path(command[1]).stem)
    module.parse_args(command[2:])  # argparse exits (SystemExit 2) on a flag or value the bench does not take


def test_a_bench_refuses_a_flag_it_does_not_take(bench):
    with pytest.raises(SystemExit):
        bench("grpo_step").parse_args(["--shape", "qwen2.5-0.5b", "--lora-rank", "16"])
    with pytest.raises(SystemExit):  # full fine-tuning skipped with no LoRA row: nothing would be timed
        bench("grpo_step").parse_args(["--skip-full"])


def test_the_pytest_ids_of_the_gpu_checks_name_tests_that_exist():
    (command,) = [c for c in script_commands("gpu_checks.sh") if c[1:3] == ["-m", "pytest"]]
    ids = [word for word in command if word.startswith("tests/")]
    assert len(ids) == 3
    for node in ids:
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file(), node
        assert not name or re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), node


def test_the_recipe_command_of_the_gpu_checks_loads_its_config(monkeypatch):
    """`gpu_checks.sh recipe`'s training command, through the real CLI up to the training itself."""
    from algos.algorithms import grpo
    from rlvr_cli import main

    (command,) = [c for c in script_commands("gpu_checks.sh") if c[1:3] == ["-m", "rlvr_cli"]]
    trained = []

    def train(config, resume):
        trained.append(config)
        return {}

    monkeypatch.setattr(grpo, "train", train)
    assert main(command[3:]) == 0
    (config,) = trained
    assert config.run.output_dir == "/tmp/gpu-recipe" and config.run.progress is False
    assert config.env.transfer_eval_kwargs  # the recipe's transfer wording, which the GPU run reports


def test_the_demo_command_of_the_gpu_checks_loads_its_config(monkeypatch):
    """`gpu_checks.sh journeys`' demo line, through examples/demo.py up to the training itself."""
    from algos.algorithms import grpo

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    demo = importlib.import_module("demo")
    (command,) = [c for c in script_commands("gpu_checks.sh") if c[1:2] == ["examples/demo.py"]]

    class Trained(Exception):  # the demo's first act after its config: training, which this test stops
        pass

    def train(config):
        raise Trained(config)

    monkeypatch.setattr(grpo, "train", train)
    with pytest.raises(Trained) as trained:
        demo.main(command[2:])
    (config,) = trained.value.args
    assert config.run.output_dir == "/tmp/gpu-demo" and config.env.id == "rlvr/Arithmetic-v0"


# Each shape's size in billions as its model card gives it: total and non-embedding (the Qwen2.5 cards), to the card's
# two decimals (Qwen2.5-7B's card truncates 7.616 to 7.61; Llama-3.2-1B's 1.236 to 1.23).
MODEL_CARDS = {"qwen2.5-0.5b": (0.49, 0.36), "qwen2.5-1.5b": (1.54, 1.31), "qwen2.5-7b": (7.61, 6.53),
               "llama-3.2-1b": (1.23, None)}


@pytest.mark.parametrize("shape", sorted(MODEL_CARDS))
def test_each_published_shape_has_its_model_cards_size_and_holds_smollm2s_token_ids(bench, shape):
    import torch
    from transformers import AutoModelForCausalLM

    grpo_step = bench("grpo_step")
    assert set(MODEL_CARDS) == set(grpo_step.SHAPES)
    config = grpo_step.shape_config(shape, pad_token_id=2, bos_token_id=1, eos_token_id=2)
    with torch.device("meta"):  # sizes without the memory
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())  # a tied head's weight is counted once
    embeddings = model.get_input_embeddings().weight.numel() * (1 if config.tie_word_embeddings else 2)
    billions, non_embedding = MODEL_CARDS[shape]
    assert 0 <= total / 1e9 - billions < 0.01
    if non_embedding is not None:
        assert abs((total - embeddings) / 1e9 - non_embedding) < 0.005
    assert config.vocab_size >= 49152  # SmolLM2's tokenizer, which every shape is timed with


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """The tiny Llama with a context long enough for the calculator task's char-tokenized prompts."""
    from rlvr_env.testing import saved_tiny_model

    path = tmp_path_factory.mktemp("bench") / "tiny"
    return str(saved_tiny_model(path, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=2048))


def run_bench(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_grpo_step_times_raw_and_ours_and_trl_with_lora_and_prints_their_ratios(tiny_model):
    """The 7B row's flags (--skip-full: ours and trl share their code with ours_lora and trl_lora, each contender is
    a process of its own, ~7 s)."""
    out = run_bench("grpo_step", "--model", tiny_model, "--prompts", "2", "--group-size", "2", "--new-tokens", "4",
                    "--lora", "4", "--skip-full", "--gradient-checkpointing")
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and " step " in line}
    assert list(rows) == ["raw", "ours_lora", "trl_lora"]
    assert "gradient checkpointing on" in out and "x" in rows["trl_lora"].split("|")[1]  # its ratio to raw
    assert "ours_lora / trl_lora: x" in out


def test_overlap_times_the_synchronous_and_the_colocated_step(tiny_model):
    out = run_bench("overlap", "--model", tiny_model, "--steps", "2", "--prompts", "2", "--group-size", "2",
                    "--new-tokens", "4")
    modes = [line.split()[:2] for line in out.splitlines() if re.match(r"^\s+[01]\s", line)]
    assert modes == [["0", "sync"], ["1", "colocated"]]
    assert "perfect overlap of the synchronous parts" in out


def test_profile_step_splits_one_step_into_collect_and_update(tiny_model):
    out = run_bench("profile_step", "--model", tiny_model, "--precision", "fp32", "--prompts", "2", "--group-size", "2",
                    "--new-tokens", "4", "--top", "3")
    assert re.search(r"collect\s+wall\s+[\d.]+ s", out) and re.search(r"update\s+wall\s+[\d.]+ s", out)


def test_the_rollout_bench_compares_a_multiturn_tasks_episode_players(tiny_model):
    out = run_bench("rollout", "--model", tiny_model, "--dtype", "float32", "--batch", "4", "--group-size", "2",
                    "--new-tokens", "4", "--repeats", "1", "--task", "rlvr/CalculatorArithmetic-v0")
    assert re.search(r"the same episode in \d+ of 4 rows", out) and re.search(r"ratio static_driver / multiturn_hf = [\d.]+", out)
