"""algos.models: loading local model directories and converting the embedded SmolLM2 GGUF once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from algos import models
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


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
def test_default_model_converts_from_the_embedded_gguf(monkeypatch, tmp_path):
    pytest.importorskip("gguf")
    try:
        models.embedded_gguf_path()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(tmp_path))
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
