"""algos.model.loading: loading local model directories and converting the embedded SmolLM2 GGUF once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from algos.model import loading as models
from rlvr_env.testing import build_char_tokenizer, build_tiny_model, saved_tiny_model


@pytest.fixture
def tiny_model_dir(tmp_path):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_load_policy_reads_a_local_directory_with_dtype_and_device(tiny_model_dir):
    model, tokenizer = models.load_policy(tiny_model_dir, dtype="bfloat16", device="cpu")
    assert model.dtype == torch.bfloat16
    assert next(model.parameters()).device.type == "cpu"
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    assert tokenizer("12+3")["input_ids"] == build_char_tokenizer()("12+3")["input_ids"]


def test_load_policy_keeps_checkpoint_dtype_by_default(tiny_model_dir):
    model, _ = models.load_policy(str(tiny_model_dir))
    assert model.dtype == torch.float32


def test_missing_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model.*does not exist"):
        models.load_policy(missing)


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        models.load_policy(tmp_path)


def test_bad_dtype_is_named(tiny_model_dir):
    with pytest.raises(ValueError, match="'float13'"):
        models.load_policy(tiny_model_dir, dtype="float13")


def test_cache_dir_follows_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(models.CACHE_ENV_VAR)
    assert models.cache_dir() == Path("~/.cache/rlvr-env").expanduser()


def test_concurrent_first_use_converts_once(monkeypatch, tmp_path, tiny_model_dir):
    """Two callers racing on an empty cache: one converts, the other waits and reuses it."""
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setattr(models, "embedded_gguf_path", lambda: Path("unused.gguf"))
    calls = []
    started = threading.Event()

    def slow_convert(gguf_path, out_dir):
        calls.append(out_dir)
        started.set()
        threading.Event().wait(0.3)  # long enough for the second caller to hit the lock
        for item in tiny_model_dir.iterdir():
            (Path(out_dir) / item.name).write_bytes(item.read_bytes())

    monkeypatch.setattr(models, "convert_gguf", slow_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(models.default_model_path())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert results[0] == results[1] == tmp_path / "cache" / models.DEFAULT_MODEL_DIRNAME
    assert (results[0] / "config.json").is_file()
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the staging directory was renamed away


def test_failed_conversion_leaves_no_model_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(tmp_path))
    monkeypatch.setattr(models, "embedded_gguf_path", lambda: Path("unused.gguf"))

    def broken_convert(gguf_path, out_dir):
        (Path(out_dir) / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "convert_gguf", broken_convert)
    with pytest.raises(RuntimeError, match="disk full"):
        models.default_model_path()
    assert not (tmp_path / models.DEFAULT_MODEL_DIRNAME).exists()
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


@pytest.mark.realmodel
def test_default_model_converts_from_the_embedded_gguf():
    """In the machine's own cache: on a fresh machine (CI) this is the conversion every other test of the real model
    then reads, so it is done and checked once (converting into a second cache took 40 s of a CI run)."""
    pytest.importorskip("gguf")
    try:
        models.embedded_gguf_path()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    path = models.default_model_path()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype"] == "bfloat16"
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert models.default_model_path() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # no second conversion

    model, tokenizer = models.load_policy("default", device="cpu")
    assert model.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )
    assert tokenizer.decode(prompt["input_ids"][0]).endswith("<|im_start|>assistant\n")
    output = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply  # de-quantized weights still make a working model


def _save(path, model, tokenizer=None):
    model.save_pretrained(path)
    (tokenizer or build_char_tokenizer()).save_pretrained(path)
    return path


def test_weights_missing_from_the_checkpoint_are_refused(tmp_path):
    """Before: a BertModel directory loaded as BertLMHeadModel with a random cls.* head, and a
    LlamaModel saved without lm_head (untied) got a random lm_head; both trained and evaluated noise."""
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    tokenizer = build_char_tokenizer()
    bert = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64)
    _save(tmp_path / "bert", BertModel(bert), tokenizer)
    with pytest.raises(ValueError, match=r"bert'.*missing.*cls\.predictions"):
        models.load_policy(tmp_path / "bert", device="cpu")

    untied = LlamaConfig(**{**build_tiny_model(tokenizer).config.to_dict(), "tie_word_embeddings": False})
    _save(tmp_path / "headless", LlamaModel(untied), tokenizer)
    with pytest.raises(ValueError, match=r"headless'.*missing.*lm_head\.weight"):
        models.load_policy(tmp_path / "headless", device="cpu")


def test_tied_and_untied_complete_models_load(tmp_path):
    """lm_head.weight is absent from a tied model's file (it shares the input embeddings): still accepted."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    tied = build_tiny_model(tokenizer)
    model, _ = models.load_policy(_save(tmp_path / "tied", tied, tokenizer), device="cpu")
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    torch.testing.assert_close(model.lm_head.weight, tied.lm_head.weight)

    untied = LlamaForCausalLM(LlamaConfig(**{**tied.config.to_dict(), "tie_word_embeddings": False}))
    model, _ = models.load_policy(_save(tmp_path / "untied", untied, tokenizer), device="cpu")
    torch.testing.assert_close(model.lm_head.weight, untied.lm_head.weight)


def test_encoder_decoder_models_are_refused_by_name(tmp_path):
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer = build_char_tokenizer()
    config = T5Config(vocab_size=len(tokenizer), d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16,
                      decoder_start_token_id=tokenizer.pad_token_id)
    _save(tmp_path / "t5", T5ForConditionalGeneration(config), tokenizer)
    with pytest.raises(ValueError, match=r"t5'.*encoder-decoder.*decoder-only causal LM"):
        models.load_policy(tmp_path / "t5", device="cpu")


def test_a_tokenizer_larger_than_the_embedding_table_is_refused(tmp_path):
    """Before: train and eval died later in torch.embedding with `IndexError: index out of range in self`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    config = build_tiny_model(tokenizer).config.to_dict()
    _save(tmp_path / "small", LlamaForCausalLM(LlamaConfig(**{**config, "vocab_size": 50})), tokenizer)
    with pytest.raises(ValueError, match=rf"small'.*{len(tokenizer)} tokens.*50 rows"):
        models.load_policy(tmp_path / "small", device="cpu")
    # a padded vocabulary (more embedding rows than tokens, as Qwen2.5 has) is fine
    _save(tmp_path / "padded", LlamaForCausalLM(LlamaConfig(**{**config, "vocab_size": len(tokenizer) + 28})), tokenizer)
    model, _ = models.load_policy(tmp_path / "padded", device="cpu")
    assert model.get_input_embeddings().num_embeddings == len(tokenizer) + 28


def test_checkpoint_and_run_directories_resolve_to_their_model(tmp_path, tiny_model_dir):
    """Before: `--model runs/x/checkpoint-N` (or `runs/x`) failed with "no config.json in it"."""
    import shutil

    run = tmp_path / "runs" / "x"
    for step in (2, 10):
        shutil.copytree(tiny_model_dir, run / f"checkpoint-{step}" / "model")
    (run / "config.yaml").write_text("{}")
    assert models.resolve_model_path(run / "checkpoint-2") == run / "checkpoint-2" / "model"
    assert models.resolve_model_path(run) == run / "checkpoint-10" / "model"  # numerically latest, not "2" > "10"
    model, _ = models.load_policy(str(run), device="cpu")
    assert model.config.vocab_size == len(build_char_tokenizer())


def test_a_directory_near_a_model_gets_a_suggestion(tmp_path, tiny_model_dir):
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "export" / "model")
    with pytest.raises(ValueError, match=r"no config\.json in it; did you mean '.*export/model'\?"):
        models.resolve_model_path(tmp_path / "export")
    # a folder of runs suggests the run
    shutil.copytree(tiny_model_dir, tmp_path / "runs" / "x" / "checkpoint-1" / "model")
    with pytest.raises(ValueError, match=r"did you mean '.*runs/x'\?"):
        models.resolve_model_path(tmp_path / "runs")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no config\.json in it$"):
        models.resolve_model_path(tmp_path / "empty")


def test_a_model_with_attention_soft_capping_loads_with_the_attention_that_applies_it(tmp_path):
    """Gemma 2 caps its attention logits in transformers' eager attention only (SDPA drops the cap)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tokenizer = build_char_tokenizer()
    config = Gemma2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, attn_logit_softcapping=50.0)
    Gemma2ForCausalLM(config).save_pretrained(tmp_path / "gemma2")
    tokenizer.save_pretrained(tmp_path / "gemma2")
    model, _ = models.load_policy(tmp_path / "gemma2", device="cpu")
    assert model.config._attn_implementation == "eager"
    llama = saved_tiny_model(tmp_path / "llama", hidden_size=16, num_layers=1, num_heads=2)
    assert models.load_policy(llama, device="cpu")[0].config._attn_implementation == "sdpa"

