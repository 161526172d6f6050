import re
from dataclasses import dataclass, field

import pytest

from algos.algorithms.grpo import DAPO_PRESET, GRPOConfig
from algos.config import _coerce, load_config, parse_overrides, save_config


def test_defaults_validate_and_match_spec():
    config = load_config(GRPOConfig)
    assert config.loss.eps_low == 0.2 and config.grpo.beta == 0.04 and config.optim.lr == 1e-6


def test_dapo_preset_turns_on_its_four_parts_and_drops_kl():
    config = load_config(GRPOConfig, preset=DAPO_PRESET)
    g, loss = config.grpo, config.loss
    assert (loss.eps_low, loss.eps_high, loss.aggregation, g.beta) == (0.2, 0.28, "token-mean", 0.0)
    assert g.dynamic_sampling and g.overlong_filter and g.soft_overlong


def test_overrides_never_modify_the_preset():
    load_config(GRPOConfig, overrides=["--loss.eps_high", "0.5"], preset=DAPO_PRESET)
    assert DAPO_PRESET["loss"]["eps_high"] == 0.28


def test_toml_then_cli_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[rollout]\ngroup_size = 4\n[grpo]\nbeta = 0.1\n[env]\nkwargs = { max_digits = 2 }\n'
                    '[optim]\nbetas = [0.9, 0.95]\n')
    config = load_config(
        GRPOConfig, path, ["--grpo.beta", "0", "--lr=3e-5", "--dual_clip", "3", "--system_prompt", "none"]
    )
    assert config.rollout.group_size == 4 and config.grpo.beta == 0.0
    assert config.optim.lr == 3e-5 and config.optim.betas == (0.9, 0.95)
    assert config.loss.dual_clip == 3.0 and config.env.system_prompt is None
    assert config.env.kwargs == {"max_digits": 2}


def test_yaml_round_trip(tmp_path):
    config = load_config(GRPOConfig, overrides={"grpo.dynamic_sampling": "true", "env.kwargs": "{a: 1}"})
    save_config(config, tmp_path / "c.yaml")
    assert load_config(GRPOConfig, tmp_path / "c.yaml") == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--grpo.bogus", "1"], "unknown config key 'grpo.bogus'"),
        (["--bogus", "1"], "unknown config key 'bogus'"),
        (["--rollout.group_size", "four"], "'rollout.group_size': expected int"),
        (["--rollout.group_size", "1"], "rollout.group_size"),
        (["--loss.aggregation", "sum"], "loss.aggregation"),
        (["--optim.betas", "[0.9]"], "'optim.betas': expected 2 items"),
        (["--grpo.overlong_filter", "maybe"], "expected true/false"),
        (["--grpo.beta"], "has no value"),
        (["--grpo.adv_eps", "0"], "grpo.adv_eps: must be > 0"),
        (["--loss.entropy_coef", "-0.01"], "loss.entropy_coef: must be >= 0"),
        (["--grpo.max_sampling_rounds", "102"], "grpo.max_sampling_rounds: must be in 1..101"),
        (["--optim.adam_eps", "-1"], "optim.adam_eps: must be > 0"),
        (["--optim.lr", "inf"], "optim.lr: must be a finite number"),
        (["--model.device", "gpu"], "model.device: must be 'auto' or a torch device"),
        (["--env.max_prompt_tokens", "0"], "env.max_prompt_tokens: must be >= 1 or null"),
        (["--model.dtype", "float16"], "model.dtype: float16 weights cannot be trained: use model.dtype = float32"),
        (["--env.kwargs", "3", "--env.kwargs.digits", "2"], "'env.kwargs.digits': 'kwargs' is not a section or a mapping"),
    ],
)
def test_bad_overrides_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(GRPOConfig, overrides=overrides)


# Each kind of type hint a config field has: what the command line (strings) and a file (typed values) may
# give it, and the whole message for what they may not.
TYPED_VALUES = [
    # bool: the words a command line uses, in any case; a file's booleans
    ("grpo.overlong_filter", "true", True), ("grpo.overlong_filter", "1", True), ("grpo.overlong_filter", "yes", True),
    ("grpo.overlong_filter", "YES", True), ("grpo.overlong_filter", "false", False), ("grpo.overlong_filter", "0", False),
    ("grpo.overlong_filter", "no", False), ("grpo.overlong_filter", "No", False), ("grpo.overlong_filter", False, False),
    # int: digits, or a file's whole float; float: any number
    ("rollout.group_size", "4", 4), ("rollout.group_size", 4.0, 4), ("optim.lr", "1", 1.0), ("optim.lr", 2, 2.0),
    ("optim.lr", "1e-5", 1e-5),
    # an optional value: none/null, or the type
    ("run.metric_for_best_model", "null", None), ("run.metric_for_best_model", "None", None),
    ("run.metric_for_best_model", None, None), ("run.metric_for_best_model", "eval_accuracy", "eval_accuracy"),
    # list[str]: flow syntax on a command line, a list in a file
    ("lora.modules_to_save", "[lm_head, embed_tokens]", ["lm_head", "embed_tokens"]), ("lora.modules_to_save", [], []),
    # list[str] | str: a list, else the string (PEFT's own regex form)
    ("lora.target_modules", "[q_proj, v_proj]", ["q_proj", "v_proj"]), ("lora.target_modules", "q_proj", "q_proj"),
    ("lora.target_modules", r".*\.(q|v)_proj", r".*\.(q|v)_proj"), ("lora.target_modules", "[qv]_proj", "[qv]_proj"),
    # tuple[float, float]
    ("optim.betas", "[0.9, 0.95]", (0.9, 0.95)), ("optim.betas", [0, 0.5], (0.0, 0.5)),
    # dict
    ("env.kwargs", "{digits: 3}", {"digits": 3}),
]
REFUSED_VALUES = [
    ("grpo.overlong_filter", "maybe", "config key 'grpo.overlong_filter': expected true/false, got 'maybe'"),
    ("grpo.overlong_filter", 1, "config key 'grpo.overlong_filter': expected true/false, got 1"),
    ("rollout.group_size", "4.0", "config key 'rollout.group_size': expected int, got '4.0'"),
    ("rollout.group_size", 4.5, "config key 'rollout.group_size': expected int, got 4.5"),
    ("rollout.group_size", True, "config key 'rollout.group_size': expected int, got True"),
    ("optim.lr", "fast", "config key 'optim.lr': expected float, got 'fast'"),
    ("run.output_dir", 5, "config key 'run.output_dir': expected a string, got 5"),
    # an optional value that is not the type names the type, not None
    ("run.metric_for_best_model", 5, "config key 'run.metric_for_best_model': expected a string, got 5"),
    ("lora.modules_to_save", "[lm_head, 2]", "config key 'lora.modules_to_save': expected a string, got 2"),
    ("lora.modules_to_save", "lm_head", "config key 'lora.modules_to_save': expected a list, got 'lm_head'"),
    # both options refused: the first option's reason
    ("lora.target_modules", 5, "config key 'lora.target_modules': expected a list, got 5"),
    ("lora.target_modules", ["q_proj", 5], "config key 'lora.target_modules': expected a string, got 5"),
    # a command-line list with a bad item is refused as a list, not taken as PEFT's regex string
    ("lora.target_modules", "[q_proj, 3]", "config key 'lora.target_modules': expected a string, got 3"),
    ("lora.target_modules", "{q_proj: 1}", "config key 'lora.target_modules': expected a list, got {'q_proj': 1}"),
    ("optim.betas", "[0.9]", "config key 'optim.betas': expected 2 items, got 1"),
    ("optim.betas", "[0.9, x]", "config key 'optim.betas': expected float, got 'x'"),
    ("optim.betas", "0.9", "config key 'optim.betas': expected a list, got 0.9"),
    ("env.kwargs", "[1]", "config key 'env.kwargs': expected a mapping, got [1]"),
    ("env.kwargs", "{digits: [", "config key 'env.kwargs': '{digits: [' is not valid YAML flow syntax"),
]


def _typed_load(key: str, value):
    """A config with `key` set to `value`: on the command line when it is a string, else as a file gives it."""
    if isinstance(value, str):
        return load_config(GRPOConfig, overrides=[f"--{key}", value])
    section, name = key.split(".")
    return load_config(GRPOConfig, preset={section: {name: value}})


@pytest.mark.parametrize("key, value, expected", TYPED_VALUES)
def test_each_kind_of_field_takes_its_values_from_a_command_line_and_a_file(key, value, expected):
    section, name = key.split(".")
    got = getattr(getattr(_typed_load(key, value), section), name)
    assert got == expected and type(got) is type(expected)
    if isinstance(got, (list, tuple)):  # items converted too: the file's int 0 is a float beta
        assert [type(item) for item in got] == [type(item) for item in expected]


@pytest.mark.parametrize("key, value, message", REFUSED_VALUES)
def test_each_kind_of_field_refuses_a_wrong_value_naming_the_key_and_the_value(key, value, message):
    with pytest.raises(ValueError) as refused:
        _typed_load(key, value)
    assert str(refused.value).startswith(message), str(refused.value)


def test_type_hints_no_field_has_yet_are_checked_too():
    """The variadic tuple and the hint config.py cannot read (a field's type added without its rule)."""
    assert _coerce("[1, 2, 3]", tuple[int, ...], "k") == (1, 2, 3)
    with pytest.raises(ValueError, match=re.escape("config key 'k': expected int, got 'x'")):
        _coerce(["1", "x"], tuple[int, ...], "k")
    with pytest.raises(ValueError, match=re.escape("config key 'k': unsupported type set[int]")):
        _coerce([1], set[int], "k")


def test_unknown_key_in_file_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  learning_rate: 1e-5\n")
    with pytest.raises(ValueError, match="unknown config key 'optim.learning_rate'"):
        load_config(GRPOConfig, path)


def test_bare_key_resolves_to_its_only_section():
    assert parse_overrides(["--run.seed", "3"]) == {"run.seed": "3"}
    assert load_config(GRPOConfig, overrides=["--seed", "3"]).run.seed == 3


@dataclass
class _Section:
    size: int = 1

    def validate(self):
        pass


@dataclass
class _TwoSections:
    a: _Section = field(default_factory=_Section)
    b: _Section = field(default_factory=_Section)

    def validate(self):
        pass


def test_float16_weights_are_refused_for_training_only():
    """fp16 AdamW turned 75,524 weights of the tiny model NaN in one step that reported a finite grad norm."""
    from algos.algorithms.ppo import PPOConfig
    from algos.config import EvalConfig

    with pytest.raises(ValueError, match="model.dtype"):
        load_config(PPOConfig, overrides=["--model.dtype", "float16"])
    assert load_config(EvalConfig, overrides=["--model.dtype", "float16"]).model.dtype == "float16"  # rlvr eval may


def test_ambiguous_bare_key_lists_the_options():
    with pytest.raises(ValueError, match="ambiguous: use one of a.size, b.size"):
        load_config(_TwoSections, overrides=["--size", "2"])
    assert load_config(_TwoSections, overrides=["--b.size", "2"]).b.size == 2


def test_overrides_inside_a_mapping_field_are_typed_and_merge():
    config = load_config(GRPOConfig, overrides=["--env.kwargs.digits", "3", "--env.kwargs.fallback_last_number", "false",
                                                 "--env.kwargs.operators", "+-*/"])
    assert config.env.kwargs == {"digits": 3, "fallback_last_number": False, "operators": "+-*/"}
    # a mapping given whole on the command line, then one key of it
    config = load_config(GRPOConfig, overrides=["--env.kwargs", "{digits: 2, terms: 3}", "--env.kwargs.digits", "4"])
    assert config.env.kwargs == {"digits": 4, "terms": 3}


# (key, the edge value accepted, a value just past it, the exact error): every checked key of the algorithm sections,
# so a check that moves its bound, names another key or loses its reason is caught.
GRPO_EDGES = [
    ("rollout.prompts_per_step", "1", "0", "must be >= 1"),
    ("rollout.group_size", "2", "1", "must be >= 2 (advantages compare samples of a group)"),
    ("grpo.num_iterations", "1", "0", "must be >= 1"),
    ("grpo.beta", "0", "-0.01", "must be >= 0"),
    ("grpo.kl_estimator", "k2", "k4", "must be one of ('k1', 'k2', 'k3')"),
    ("grpo.kl_clamp", "1e-6", "0", "must be > 0"),
    ("grpo.adv_estimator", "rloo", "rank", "must be one of ('grpo', 'batch-std', 'dr-grpo', 'rloo')"),
    ("grpo.adv_eps", "1e-12", "0", "must be > 0"),
    ("grpo.process_weight", "0", "-0.01", "must be >= 0"),
    ("grpo.dynamic_sampling_metric", "score", "reward", "must be 'acc' or 'score', got 'reward'"),
    ("grpo.overlong_penalty_factor", "0", "-0.01", "must be >= 0"),
    ("grpo.max_sampling_rounds", "1", "0", "must be in 1..101"),
    ("grpo.max_sampling_rounds", "101", "102", "must be in 1..101"),
    ("grpo.overlong_cache", "1", "0", "must be >= 1"),
    ("grpo.overlong_cache", "64", "65", "must be <= env.max_new_tokens (64) while grpo.soft_overlong is on (--algo dapo "
     "turns it on): DAPO's penalty grows over the budget's last grpo.overlong_cache tokens; set grpo.overlong_cache "
     "<= 64, or grpo.soft_overlong = false", {"grpo.soft_overlong": "true"}),
    ("loss.surrogate", "gmpo", "clip", "must be one of ('ppo-clip', 'gspo', 'cispo', 'gmpo')"),
    ("loss.eps_low", "1", "1.001", "must be in (0, 1] (1: no lower bound on the ratio)"),
    ("loss.eps_low", "0.001", "0", "must be in (0, 1] (1: no lower bound on the ratio)"),
    ("loss.eps_high", "1e-6", "0", "must be > 0"),
    ("loss.dual_clip", "1.001", "1", "must be > 1 or null"),
    ("loss.aggregation", "seq-mean-token-sum-norm", "sum",
     "must be one of ('token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm')"),
    ("loss.entropy_coef", "0", "-0.01", "must be >= 0 (a bonus; negative would penalise entropy)"),
    ("loss.micro_batch_size", "1", "0", "must be 'auto' or a number of rows >= 1, got 0"),
    ("loss.logprob_chunk_size", "1", "0", "must be >= 1"),
    ("lora.r", "0", "-1", "must be >= 0 (0 = no LoRA), got -1"),
    ("lora.alpha", "1e-6", "0", "must be > 0, got 0.0"),
    ("lora.dropout", "0", "-0.01", "must be in [0, 1), got -0.01"),
    ("lora.dropout", "0.99", "1", "must be in [0, 1), got 1.0"),
    ("lora.target_modules", "all-linear", "[]", "must name at least one module, or 'all-linear'"),
]
PPO_EDGES = [
    *[(f"ppo.{name}", "1", "0", "must be >= 1") for name in (
        "ppo_epochs", "num_minibatches", "reward_model_batch_size", "kl_horizon")],
    ("rollout.group_size", "1", "0", "must be >= 1"),
    ("rollout.prompts_per_step", "1", "0", "must be >= 1", {"ppo.num_minibatches": "1"}),
    ("ppo.num_minibatches", "16", "17", "must be <= rows per step (16)"),
    ("ppo.gamma", "1", "1.01", "must be in (0, 1]"),
    ("ppo.gamma", "0.01", "0", "must be in (0, 1]"),
    ("ppo.lam", "0", "-0.01", "must be in [0, 1]"),
    ("ppo.lam", "1", "1.01", "must be in [0, 1]"),
    ("ppo.value_model", "none", "shared", "must be one of ('head', 'separate', 'none')"),
    ("ppo.value_clip", "1e-6", "0", "must be > 0 or null"),
    ("ppo.vf_coef", "1e-6", "0", "must be > 0"),
    ("ppo.critic_lr", "1e-9", "0", "must be > 0 or null"),
    ("ppo.critic_warmup_steps", "0", "-1", "must be >= 0"),
    ("ppo.kl_coef", "0", "-0.01", "must be >= 0"),
    ("ppo.kl_estimator", "k3", "k4", "must be one of ('k1', 'k2', 'k3')"),
    ("ppo.kl_clamp", "1e-6", "0", "must be > 0"),
    ("ppo.kl_target", "1e-6", "0", "must be > 0 or null"),
    ("ppo.reward_source", "env", "judge", "must be one of ('env', 'model')"),
]


@pytest.mark.parametrize("algorithm, key, accepted, refused, message, others",
                         [("grpo", *(*edge, {})[:5]) for edge in GRPO_EDGES] + [("ppo", *(*edge, {})[:5]) for edge in PPO_EDGES])
def test_each_algorithm_key_accepts_its_edge_and_names_itself_past_it(algorithm, key, accepted, refused, message, others):
    """``others``: keys the edge needs besides (one prompt per step leaves room for one minibatch only)."""
    from algos.algorithms.ppo import PPOConfig

    config_cls = PPOConfig if algorithm == "ppo" else GRPOConfig
    section, name = key.split(".")
    value = getattr(getattr(load_config(config_cls, overrides={**others, key: accepted}), section), name)
    assert value == (float(accepted) if re.fullmatch(r"[\d.e-]+", accepted) else accepted)
    with pytest.raises(ValueError, match=rf"^config {re.escape(key)}: {re.escape(message)}$"):
        load_config(config_cls, overrides={**others, key: refused})


def test_a_section_given_in_part_keeps_its_algorithms_defaults_for_the_rest(tmp_path):
    """PPOConfig's `loss` section aggregates by token-mean with 16-row micro-batches; setting one loss key (from the
    command line or a file) must not bring back the class defaults (GRPO's per-sequence mean) for the others."""
    from algos.algorithms.ppo import PPOConfig

    config = load_config(PPOConfig, overrides={"loss.entropy_coef": "0.01"})
    assert (config.loss.entropy_coef, config.loss.aggregation, config.loss.micro_batch_size) == (0.01, "token-mean", 16)
    path = tmp_path / "ppo.toml"
    path.write_text("[loss]\nmicro_batch_size = 4\n")
    assert load_config(PPOConfig, path).loss.aggregation == "token-mean"
    assert load_config(GRPOConfig, overrides={"loss.entropy_coef": "0.01"}).loss.aggregation == "seq-mean-token-mean"


def checkpoint_written_before_a_move(tmp_path, config, move_back):
    """tmp_path/checkpoint-2 whose config.yaml is ``config`` as a release before some keys moved wrote it: saved, then
    ``move_back`` (given the saved sections, changed in place) puts the moved keys back where that release kept them."""
    import yaml

    from algos.run.checkpoint import CONFIG_FILE

    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    save_config(config, checkpoint / CONFIG_FILE)
    saved = yaml.safe_load((checkpoint / CONFIG_FILE).read_text())
    move_back(saved)
    (checkpoint / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    return checkpoint


def test_a_moved_key_is_read_under_its_old_name_from_flags_files_and_old_checkpoints(tmp_path):
    from algos.algorithms.ppo import PPOConfig
    from algos.run.directory import check_resumable

    with pytest.warns(FutureWarning, match="grpo.max_episode_tokens is now rollout.max_episode_tokens"):
        assert load_config(GRPOConfig, overrides={"grpo.max_episode_tokens": "40"}).rollout.max_episode_tokens == 40
    (tmp_path / "old.yaml").write_text("ppo: {max_episode_tokens: 50}\n")
    with pytest.warns(FutureWarning, match="ppo.max_episode_tokens"):
        assert load_config(PPOConfig, tmp_path / "old.yaml").rollout.max_episode_tokens == 50
    (tmp_path / "both.yaml").write_text("ppo: {max_episode_tokens: 50}\nrollout: {max_episode_tokens: 60}\n")
    both = "ppo.max_episode_tokens = 50 and rollout.max_episode_tokens = 60"
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=both):
        load_config(PPOConfig, tmp_path / "both.yaml")
    # a checkpoint written before the key moved: its config.yaml says grpo.max_episode_tokens
    config = load_config(GRPOConfig, overrides={"rollout.max_episode_tokens": "70", "run.steps": "4"})
    checkpoint = checkpoint_written_before_a_move(
        tmp_path, config, lambda saved: saved["grpo"].update(max_episode_tokens=saved["rollout"].pop("max_episode_tokens")))
    with pytest.warns(FutureWarning):
        check_resumable(config, checkpoint)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="rollout.max_episode_tokens: 70 -> 80"):
        check_resumable(load_config(GRPOConfig, overrides={"rollout.max_episode_tokens": "80", "run.steps": "4"}), checkpoint)


def test_the_engines_keys_are_read_under_their_old_rollout_names(tmp_path):
    """rollout.decode_graph and rollout.vllm_* moved into their engines' sections ([static], [vllm]); flags, files and
    a checkpoint's config.yaml written before still say the old names."""
    from algos.run.directory import check_resumable

    with pytest.warns(FutureWarning) as caught:
        config = load_config(GRPOConfig, overrides={"rollout.decode_graph": "eager", "rollout.vllm_dtype": "float16"})
    assert {str(w.message).split(":")[0] for w in caught} == {"config key rollout.decode_graph is now static.decode_graph",
                                                            "config key rollout.vllm_dtype is now vllm.dtype"}
    assert (config.engine_sections["static"].decode_graph, config.engine_sections["vllm"].dtype) == ("eager", "float16")
    (tmp_path / "old.toml").write_text("[rollout]\nvllm_gpu_memory_utilization = 0.5\n"
                                       "vllm_engine_kwargs = {enforce_eager = true}\n")
    with pytest.warns(FutureWarning) as caught:
        vllm = load_config(GRPOConfig, tmp_path / "old.toml").engine_sections["vllm"]
    assert len(caught) == 2 and "rollout.vllm_engine_kwargs is now vllm.engine_kwargs" in str(caught[1].message)
    assert (vllm.gpu_memory_utilization, vllm.engine_kwargs) == (0.5, {"enforce_eager": True})
    # a checkpoint written before the keys moved resumes, and a changed vllm dtype is still named
    def move_back(saved):
        saved["rollout"]["decode_graph"] = saved.pop("static")["decode_graph"]
        saved["rollout"].update({f"vllm_{name}": value for name, value in saved.pop("vllm").items()})

    checkpoint = checkpoint_written_before_a_move(tmp_path, config, move_back)
    with pytest.warns(FutureWarning):
        check_resumable(config, checkpoint)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="vllm.dtype: 'float16' -> 'bfloat16'"):
        check_resumable(load_config(GRPOConfig, overrides={"static.decode_graph": "eager", "vllm.dtype": "bfloat16"}),
                        checkpoint)


def test_the_sampling_twins_are_one_rollout_key_read_under_every_old_name(tmp_path):
    """grpo.prompts_per_step / grpo.group_size and ppo.prompts_per_step / ppo.samples_per_prompt were twins; they are
    rollout.prompts_per_step and rollout.group_size for every algorithm, each algorithm keeping its defaults, and an
    old checkpoint's config.yaml resumes."""
    from algos.algorithms.dpo import DPOConfig
    from algos.algorithms.ppo import PPOConfig
    from algos.run.directory import check_resumable

    assert (GRPOConfig().rollout.prompts_per_step, GRPOConfig().rollout.group_size) == (8, 8)
    assert (PPOConfig().rollout.prompts_per_step, PPOConfig().rollout.group_size) == (16, 1)
    assert (DPOConfig().rollout.prompts_per_step, DPOConfig().rollout.group_size) == (8, 8)
    with pytest.warns(FutureWarning) as caught:
        ppo = load_config(PPOConfig, overrides={"ppo.samples_per_prompt": "4", "ppo.prompts_per_step": "2"})
    assert {str(w.message).split(":")[0] for w in caught} == {"config key ppo.samples_per_prompt is now rollout.group_size",
                                                            "config key ppo.prompts_per_step is now rollout.prompts_per_step"}
    assert (ppo.rollout.prompts_per_step, ppo.rollout.group_size) == (2, 4)
    (tmp_path / "old.toml").write_text("[grpo]\nprompts_per_step = 4\ngroup_size = 2\n")
    with pytest.warns(FutureWarning) as caught:
        grpo = load_config(GRPOConfig, tmp_path / "old.toml")
    assert len(caught) == 2 and "grpo.group_size is now rollout.group_size" in "; ".join(str(w.message) for w in caught)
    assert (grpo.rollout.prompts_per_step, grpo.rollout.group_size) == (4, 2)
    # a checkpoint written before the keys moved resumes, and a changed group size is still named
    def move_back(saved):
        for name in ("prompts_per_step", "group_size"):
            saved["grpo"][name] = saved["rollout"].pop(name)

    checkpoint = checkpoint_written_before_a_move(tmp_path, grpo, move_back)
    with pytest.warns(FutureWarning):
        check_resumable(grpo, checkpoint)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="rollout.group_size: 2 -> 3"):
        check_resumable(load_config(GRPOConfig, overrides={"rollout.prompts_per_step": "4", "rollout.group_size": "3"}),
                        checkpoint)


@pytest.mark.parametrize(("overrides", "second"), [
    ({}, False),  # the default: one evaluation
    ({"env.transfer_eval_kwargs": '{"few_shot": []}'}, True),
    ({"env.transfer_eval_chat_template": "true"}, True),  # the same prompt, rendered the other way
    ({"env.transfer_eval_kwargs": '{"few_shot": []}', "env.transfer_eval_chat_template": "false"}, True),
])
def test_either_transfer_key_sets_a_second_evaluation(overrides, second):
    assert load_config(GRPOConfig, overrides=overrides).env.has_transfer_eval() is second
