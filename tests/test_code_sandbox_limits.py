"""The code sandbox's limits bind for the whole run, and a program that solves nothing earns nothing.

- ``processes``: a program that starts 60 processes through ``_posixsubprocess.fork_exec`` (no audit event
  fires for it), or 60 threads, never has more than ``processes`` of them alive at once (the run's pids cgroup,
  which it enters before bwrap forks anything);
- ``memory_mb``: children that allocate 8 x 200 MB, or files written to its tmpfs, are stopped at the run's
  memory cap (its memory cgroup), an error "over the memory limit", never an exception out of ``env.step``;
- the cgroup shapes (v1 hierarchies, a v2 subtree) read from the mount table, with the limits each one takes;
- constant functions score 0 on every bundled Code-v0 problem by default; the gold solutions still score 1.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import gymnasium as gym
import pytest

import rlvr_env  # noqa: F401  (registers rlvr/Code-v0)
from rewards import run_cgroup
from rewards.code import CodeLimits, run_code
from rewards.run_cgroup import MEMORY, PIDS, CgroupRoot, RunCgroup, cgroup_candidates, cgroup_roots

needs_cgroups = pytest.mark.skipif({PIDS, MEMORY} - set(cgroup_roots()),
                                   reason="no pids and memory cgroups can be made here (root or a delegated subtree)")

LIMITS = CodeLimits(timeout_s=8.0, cpu_s=4, processes=16)

# A process started through _posixsubprocess.fork_exec, which no audit hook sees: start(argv) -> its pid.
FORK_EXEC = """
import _posixsubprocess, os

def start(argv):
    errpipe_read, errpipe_write = os.pipe()
    try:
        return _posixsubprocess.fork_exec(argv, argv[:1], True, (errpipe_write,), None, None, -1, -1, -1, -1, -1, -1,
                                          errpipe_read, errpipe_write, False, False, -1, None, None, None, -1, None,
                                          False)
    finally:
        os.close(errpipe_read)
        os.close(errpipe_write)
"""

# Starts up to 60 `sleep 5` processes; returns how many started.
FORK_EXEC_SIXTY = FORK_EXEC + """
def spawn():
    started = 0
    for _ in range(60):
        try:
            start([b"/bin/sleep", b"5"])
            started += 1
        except OSError:
            pass
    return started
"""

THREADS_SIXTY = """
import threading, time

def spawn():
    threading.stack_size(256 << 10)  # 60 default stacks would hit the address-space limit before the pids cap
    started = 0
    for _ in range(60):
        try:
            threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
            started += 1
        except RuntimeError:  # "can't start new thread": the pids cap
            pass
    return started
"""

# Eight children, 200 MB each, touched (not calloc'd zero pages), all alive at once.
EIGHT_TIMES_200_MB = FORK_EXEC + """
import sys

CHILD = "import time; block = b'x' * (200 << 20); time.sleep(3)"

def hog():
    children = [start([sys.executable.encode(), b"-S", b"-c", CHILD.encode()]) for _ in range(8)]
    return sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children)
"""


@needs_cgroups
@pytest.mark.parametrize("program", [FORK_EXEC_SIXTY, THREADS_SIXTY], ids=["fork_exec", "threads"])
def test_sixty_processes_or_threads_never_pass_the_processes_limit(program):
    run = run_code(program, [f"assert 1 <= spawn() <= {LIMITS.processes}"], limits=LIMITS)
    assert (run.status, run.passed) == ("ok", 1), run


@needs_cgroups
def test_children_over_the_run_s_memory_are_stopped_at_its_cap():
    run = run_code(EIGHT_TIMES_200_MB, ["assert hog() == [0] * 8"], limits=LIMITS)
    assert (run.status, run.reason) == ("error", "over the memory limit (512 MB for the whole run)"), run


FILL_TMPFS = """
def fill():
    for i in range(8):
        with open(f"/tmp/block{i}", "wb") as handle:
            handle.write(b"x" * (50 << 20))
    return 400
"""


@needs_cgroups
def test_the_files_of_its_tmpfs_count_in_the_run_s_memory():
    limits = CodeLimits(timeout_s=8.0, cpu_s=4, memory_mb=256, disk_mb=1024, file_mb=512)
    run = run_code(FILL_TMPFS, ["assert fill() == 400"], limits=limits)
    assert (run.status, run.reason) == ("error", "over the memory limit (256 MB for the whole run)"), run


@needs_cgroups
def test_the_memory_cap_is_an_error_status_out_of_env_step():
    env = gym.make("rlvr/Code-v0", limits={"timeout_s": 8.0, "cpu_s": 4})
    env.reset(seed=0, options={"problem_index": 0})
    code = EIGHT_TIMES_200_MB + "\ndef digit_sum(n):\n    hog()\n    return sum(int(d) for d in str(n))\n"
    _, reward, terminated, _, info = env.step(f"```python\n{code}```")
    assert (reward, terminated, info["verifier_status"]) == (0.0, True, "error")


@needs_cgroups
def test_a_run_enters_its_cgroups_before_it_forks_and_they_are_removed_after():
    cgroup = RunCgroup.create(max_pids=5, memory_bytes=64 << 20)
    folders = sorted({path for path, _ in cgroup.folders.values()})
    assert cgroup.controllers == {PIDS, MEMORY} and folders
    command = cgroup.entering(["/bin/sh", "-c", "cat /proc/self/cgroup"])
    assert command[:3] == ["/bin/sh", "-c", run_cgroup.ENTER_SCRIPT]
    own = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    for path in folders:  # the shell the command runs as is a member of each run cgroup, from its start
        assert path.rsplit("/", 1)[1] in own
    cgroup.kill_all_and_remove()
    assert not any(os.path.exists(path) for path in folders)


@needs_cgroups
def test_what_is_left_running_in_a_run_s_cgroups_is_killed_and_the_cgroups_removed():
    cgroup = RunCgroup.create(max_pids=5, memory_bytes=64 << 20)
    folders = sorted({path for path, _ in cgroup.folders.values()})
    left = subprocess.Popen(cgroup.entering(["sleep", "30"]), start_new_session=True)
    try:
        procs = [Path(path, "cgroup.procs") for path in folders]
        deadline = time.monotonic() + 10
        while not all(str(left.pid) in f.read_text().split() for f in procs):  # it has joined every cgroup
            assert time.monotonic() < deadline and left.poll() is None
            time.sleep(0.01)
        cgroup.kill_all_and_remove()
        assert left.wait(timeout=5) == -9
    finally:
        left.kill()
    assert not any(os.path.exists(path) for path in folders)


def test_a_root_counts_for_the_limits_its_probe_cgroup_takes(tmp_path, monkeypatch):
    """cgroup_roots probes each candidate with a cgroup of its own; a root where none can be made gives nothing."""
    writable, missing = tmp_path / "v2", tmp_path / "gone"
    writable.mkdir()
    candidates = [CgroupRoot(str(missing), 1, frozenset({PIDS})), CgroupRoot(str(writable), 2, frozenset({PIDS, MEMORY}))]
    monkeypatch.setattr(run_cgroup, "cgroup_candidates", lambda mounts, own: candidates)
    run_cgroup.cgroup_roots.cache_clear()
    try:
        assert run_cgroup.cgroup_roots() == {PIDS: candidates[1], MEMORY: candidates[1]}
    finally:
        run_cgroup.cgroup_roots.cache_clear()
    (probe,) = writable.glob("rlvr-probe-*")  # a folder of plain files stays behind: the kernel's would go
    assert {f.name: f.read_text() for f in probe.iterdir()} == {"pids.max": "1", "memory.max": str(64 << 20)}


@pytest.mark.parametrize("version, files, killed", [
    (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"}, True),
    (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", "memory.failcnt": "9"}, False),
    (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n", "memory.failcnt": "3\n"}, True),  # before 4.13
    (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n", "memory.failcnt": "0\n"}, False),
    (2, {"memory.events": "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n"}, True),
    (2, {"memory.events": "low 0\nhigh 0\nmax 4\noom 0\noom_kill 0\n"}, False),
    (2, {}, False),  # the folder is gone
])
def test_the_memory_cap_s_kills_are_read_from_each_shape_s_counters(tmp_path, version, files, killed):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert RunCgroup({MEMORY: (str(tmp_path), version)}).over_memory() is killed
    assert RunCgroup({PIDS: (str(tmp_path), version)}).over_memory() is False  # no memory cgroup, no memory cap


MOUNTS_V1 = """cgroup /sys/fs/cgroup/pids cgroup rw,nosuid,relatime,pids 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,relatime,memory 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
"""
OWN_V1 = "8:pids:/job\n4:memory:/job/box\n3:cpu,cpuacct:/\n0::/\n"


def test_cgroup_v1_shape_gives_a_pids_and_a_memory_hierarchy_at_the_process_s_own_cgroups():
    assert cgroup_candidates(MOUNTS_V1, OWN_V1) == [
        CgroupRoot("/sys/fs/cgroup/pids/job", 1, frozenset({PIDS})),
        CgroupRoot("/sys/fs/cgroup/memory/job/box", 1, frozenset({MEMORY})),
    ]


def test_cgroup_v2_shape_gives_the_controllers_its_subtree_enables(tmp_path):
    own = tmp_path / "user.slice"
    own.mkdir()
    (own / "cgroup.subtree_control").write_text("cpu memory pids\n")
    mounts = f"cgroup2 {tmp_path} cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
    assert cgroup_candidates(mounts, "0::/user.slice\n") == [CgroupRoot(str(own), 2, frozenset({PIDS, MEMORY}))]
    (own / "cgroup.subtree_control").write_text("cpu\n")  # no controller of ours delegated: no root
    assert cgroup_candidates(mounts, "0::/user.slice\n") == []


@pytest.mark.parametrize("version, written", [
    (1, {"memory.limit_in_bytes": "1048576", "memory.memsw.limit_in_bytes": "1048576", "pids.max": "7"}),
    (1, {"memory.limit_in_bytes": "1048576", "memory.swappiness": "0", "pids.max": "7"}),  # no swap accounting
    (2, {"memory.max": "1048576", "memory.swap.max": "0", "memory.oom.group": "1", "pids.max": "7"}),
])
def test_each_shape_gets_its_limits_with_swap_off(tmp_path, monkeypatch, version, written):
    for name in written:  # the kernel's files of a fresh cgroup
        (tmp_path / name).write_text("max\n")
    root = CgroupRoot(str(tmp_path.parent), version, frozenset({PIDS, MEMORY}))
    monkeypatch.setattr(run_cgroup, "cgroup_roots", lambda: {PIDS: root, MEMORY: root})
    monkeypatch.setattr(run_cgroup.os, "mkdir", lambda path: None)
    monkeypatch.setattr(run_cgroup.os.path, "join", lambda *parts: str(tmp_path))
    cgroup = RunCgroup.create(max_pids=7, memory_bytes=1 << 20)
    assert cgroup.controllers == {PIDS, MEMORY}
    assert {name: (tmp_path / name).read_text() for name in written} == written


def test_without_cgroups_the_run_warns_once_and_runs_on_its_rlimits(monkeypatch):
    monkeypatch.setattr(run_cgroup, "cgroup_candidates", lambda mounts, own: [])
    run_cgroup.cgroup_roots.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match=r"no pids or memory cgroup can be made here .*RLIMIT_NPROC"):
            assert run_cgroup.cgroup_roots() == {}
        assert RunCgroup.create(5, 1 << 20).entering(["true"]) == ["true"]
        run = run_code("def f():\n    return 1\n", ["assert f() == 1"], limits=CodeLimits(timeout_s=5.0))
        assert (run.status, run.passed) == ("ok", 1)
    finally:
        run_cgroup.cgroup_roots.cache_clear()


CONSTANTS = ["True", "False", "None", "0", "[]", "''"]


def test_a_constant_function_earns_nothing_on_any_bundled_problem():
    env = gym.make("rlvr/Code-v0", limits={"timeout_s": 5.0})
    task = env.unwrapped.task
    for index in range(task.size):
        name = task.problem(index, 0).metadata["code"].split("def ", 1)[1].split("(", 1)[0]
        for constant in CONSTANTS:
            env.reset(seed=0, options={"problem_index": index})
            _, reward, *_ = env.step(f"```python\ndef {name}(*args, **kwargs):\n    return {constant}\n```")
            assert reward == 0.0, (index, constant)


def test_partial_credit_is_the_fraction_and_a_constant_can_farm_it():
    env = gym.make("rlvr/Code-v0", partial_credit=True, limits={"timeout_s": 5.0})
    env.reset(seed=0, options={"problem_index": 1})  # is_palindrome: two of its four tests expect True
    _, reward, *_ = env.step("```python\ndef is_palindrome(s):\n    return True\n```")
    assert reward == 0.5
    with pytest.raises(ValueError, match="partial_credit must be true or false, got 'yes'"):
        gym.make("rlvr/Code-v0", partial_credit="yes")
