"""algos.run.checkpoint's contract at its edges: where it writes, what it fsyncs, what it refuses, what it prunes."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from transformers import AutoTokenizer

from algos.run import checkpoint
from algos.run.checkpoint import load_checkpoint, save_checkpoint
from algos.system.paths import checkpoint_step, latest_checkpoint, list_checkpoints
from rlvr_env.testing import build_char_tokenizer, build_tiny_model


def _tiny(num_layers: int = 1):
    model = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=num_layers, num_heads=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer


def test_a_checkpoint_lands_in_a_new_nested_directory_with_its_tokenizer_and_every_file_fsynced(tmp_path, monkeypatch):
    model, optimizer = _tiny()
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or fsync(fd))
    path = save_checkpoint(tmp_path / "a" / "b", 3, model=model, optimizer=optimizer, tokenizer=build_char_tokenizer())
    assert path == tmp_path / "a" / "b" / "checkpoint-3" and checkpoint_step(path) == 3
    saved_tokenizer = AutoTokenizer.from_pretrained(path / "model")
    assert saved_tokenizer.convert_tokens_to_ids("7") == build_char_tokenizer().convert_tokens_to_ids("7")
    written = path.parent / f".checkpoint-3.tmp-{os.getpid()}"  # each file was synced under the temporary name
    assert {str(written / f.relative_to(path)) for f in path.rglob("*") if f.is_file()} <= set(synced)
    assert str(tmp_path / "a" / "b") in synced  # and the directory after the rename


def test_replace_directory_leaves_a_whole_copy_under_one_name_or_the_other(tmp_path, monkeypatch):
    """The swap a checkpoint and best_model/ share: killed between its two renames, the old copy is whole under the
    stale name (and the new one under its own); uninterrupted, the new one is in place, synced, and the old gone."""
    final, written, stale = tmp_path / "best", tmp_path / ".best.tmp", tmp_path / ".best.stale"
    for directory, text in ((final, "old"), (written, "new")):
        directory.mkdir()
        (directory / "weights").write_text(text)
    rename = type(final).rename

    def killed_at_the_second_rename(self, target):
        if self == written:
            raise KeyboardInterrupt
        return rename(self, target)

    with monkeypatch.context() as patched:
        patched.setattr(type(final), "rename", killed_at_the_second_rename)
        with pytest.raises(KeyboardInterrupt):
            checkpoint.replace_directory(written, final, stale=stale)
    assert (stale / "weights").read_text() == "old" and (written / "weights").read_text() == "new"
    assert not final.exists()
    stale.rename(final)
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or fsync(fd))
    checkpoint.replace_directory(written, final, stale=stale)
    assert (final / "weights").read_text() == "new" and not stale.exists() and not written.exists()
    assert synced == [str(written / "weights"), str(tmp_path)]  # the file under its temporary name, then the rename


def test_a_step_saved_again_replaces_the_old_one_and_a_dead_writers_leftover_is_overwritten(tmp_path):
    model, optimizer = _tiny()
    (tmp_path / f".checkpoint-1.tmp-{os.getpid()}").mkdir()  # our own pid's half-written folder, from before a crash
    save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer)
    with torch.no_grad():
        model.model.norm.weight.fill_(3.0)
    save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-1"]
    fresh, fresh_optimizer = _tiny()
    load_checkpoint(tmp_path / "checkpoint-1", model=fresh, optimizer=fresh_optimizer)
    assert fresh.model.norm.weight.eq(3.0).all()


def test_two_checkpoints_are_kept_by_default_and_a_delete_that_fails_does_not_fail_the_save(tmp_path, monkeypatch):
    model, optimizer = _tiny()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model=model, optimizer=optimizer)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]
    (tmp_path / ".checkpoint-9.tmp-4194305").mkdir()  # a leftover of a dead process (pid above Linux's pid_max)
    rmtree = checkpoint.shutil.rmtree

    def busy(path, ignore_errors=False):  # an old checkpoint on a busy network filesystem
        if not ignore_errors:
            raise OSError(f"{path}: device or resource busy")

    monkeypatch.setattr(checkpoint.shutil, "rmtree", busy)
    save_checkpoint(tmp_path, 4, model=model, optimizer=optimizer)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    assert latest_checkpoint(tmp_path).name == "checkpoint-4"


def test_liveness_of_writers_is_probed_without_a_signal(monkeypatch):
    sent = []
    kill = os.kill
    monkeypatch.setattr(checkpoint.os, "kill", lambda pid, signal: sent.append(signal) or kill(pid, signal))
    assert checkpoint._process_alive(os.getpid())
    assert not checkpoint._process_alive(4194305)
    assert sent == [0, 0]  # signal 0 only probes; any other would reach the process

    def not_ours(pid, signal):
        raise PermissionError

    monkeypatch.setattr(checkpoint.os, "kill", not_ours)
    assert checkpoint._process_alive(1)  # alive, owned by someone else


def test_loading_refuses_a_checkpoint_of_another_shape_or_without_its_state_and_needs_no_scheduler(tmp_path):
    model, optimizer = _tiny(num_layers=1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer, scheduler=scheduler)
    bigger, bigger_optimizer = _tiny(num_layers=2)
    with pytest.raises(ValueError, match=r"checkpoint .*checkpoint-1 does not match the model: missing \['model\.layers\.1\."):
        load_checkpoint(path, model=bigger, optimizer=bigger_optimizer)
    fresh, fresh_optimizer = _tiny()
    assert load_checkpoint(path, model=fresh, optimizer=fresh_optimizer)["step"] == 1  # scheduler saved, none given
    shutil.rmtree(path / "state")
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*checkpoint-1 has no state/ \(the weights and optimizer state\)"):
        load_checkpoint(path, model=fresh, optimizer=fresh_optimizer)
    with pytest.raises(ValueError, match=r"^.*model is not a checkpoint-<step> directory$"):
        checkpoint_step(path / "model")
