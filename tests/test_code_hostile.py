"""Hostile programs through the training loop's own path: ``gym.make("rlvr/Code-v0")``, ``env.step``.

Every program of ``tests/hostile_code.py``, on every bundled problem, from the caller's thread, from
threads and from asyncio: reward 0, and the host unchanged (no marker file outside, the kept file
intact, the project's files hashing the same, no process left running, a victim process and the
caller alive). Every bundled gold solution still scores 1.0.

    .venv/bin/python tests/test_code_hostile.py    # the table: program -> best reward, host effects
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_code import PROGRAMS  # noqa: E402

import rlvr_env  # noqa: E402,F401  (registers rlvr/Code-v0)
from rewards.code_sandbox import BUBBLEWRAP, available_isolation  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1]
FAST_LIMITS = {"timeout_s": 3.0, "cpu_s": 2}


def project_digest() -> str:
    """One hash over the project's Python and data files (what a program could plant or rewrite)."""
    digest = hashlib.sha256()
    for path in sorted(PROJECT.glob("[!.]*/**/*")):
        if path.suffix in (".py", ".jsonl") and ".venv" not in path.parts and path.is_file():
            digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def called_function(test: str) -> str:
    """The name the first test calls, e.g. ``digit_sum`` in ``assert digit_sum(0) == 0``."""
    calls = [node.func.id for node in ast.walk(ast.parse(test)) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    return next(name for name in calls if name not in ("set", "sorted", "list", "tuple", "abs", "round"))


def bundled_problems() -> list[tuple[int, str]]:
    env = gym.make("rlvr/Code-v0")
    task = env.unwrapped.task
    return [(index, called_function(task.problem(index, 0).answer["tests"][0])) for index in range(task.size)]


def episode_reward(index: int, code: str) -> tuple[float, str]:
    env = gym.make("rlvr/Code-v0", limits=FAST_LIMITS)
    env.reset(seed=0, options={"problem_index": index})
    _, reward, terminated, _, info = env.step(f"```python\n{code}\n```")
    assert terminated
    return reward, info["verifier_status"]


class Host:
    """What a program could change outside: a marker path, a kept file, the project, processes, a victim."""

    def __init__(self, tmp: Path) -> None:
        self.outside, self.keep = tmp / "escaped.txt", tmp / "keep.txt"
        self.keep.write_text("keep")
        self.marker = f"rlvr-hostile-{uuid.uuid4().hex}"
        self.victim = subprocess.Popen(["sleep", "300"])
        self.digest = project_digest()

    def preamble(self, fn: str) -> str:
        values = {"FN": fn, "OUTSIDE": str(self.outside), "KEEP": str(self.keep), "PROJECT": str(PROJECT),
                  "VICTIM": self.victim.pid, "MARKER": self.marker}
        return "".join(f"{key} = {value!r}\n" for key, value in values.items())

    def effects(self) -> list[str]:
        effects = []
        if self.outside.exists():
            effects.append("wrote outside")
        if not self.keep.exists() or self.keep.read_text() != "keep":
            effects.append("changed a file outside")
        if project_digest() != self.digest:
            effects.append("changed the project")
        if processes_with(self.marker):
            effects.append("left processes")
        if self.victim.poll() is not None:
            effects.append("killed a process outside")
        return effects

    def close(self) -> None:
        for pid in processes_with(self.marker):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.victim.kill()
        self.victim.wait()


# What the host must not see changed needs the real sandbox; the verdict-level hacks are also tested
# under the fallbacks in tests/test_rewards_code.py.
needs_bubblewrap = pytest.mark.skipif(available_isolation() != BUBBLEWRAP,
                                      reason="bwrap is not installed (`make setup` installs Debian's bubblewrap)")


@pytest.fixture(scope="module")
def problems():
    return bundled_problems()


@needs_bubblewrap
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_hostile_program_scores_nothing_and_changes_nothing(name, problems, tmp_path):
    host = Host(tmp_path)
    try:
        with ThreadPoolExecutor(2) as pool:  # from threads, as score_batch and vector envs call it
            rewards = list(pool.map(lambda p: episode_reward(p[0], host.preamble(p[1]) + PROGRAMS[name]), problems))
        assert [reward for reward, _ in rewards] == [0.0] * len(problems), rewards
        assert host.effects() == []
    finally:
        host.close()


@needs_bubblewrap
def test_hostile_programs_from_asyncio(problems, tmp_path):
    host = Host(tmp_path)
    index, fn = problems[0]
    names = ["__eq__ always true (str subclass)", "a forged verdict on every file descriptor, then os._exit",
             "a write outside through dir_fd", "a process left running (double fork, new session)"]

    async def score_all():
        return await asyncio.gather(*(asyncio.to_thread(episode_reward, index, host.preamble(fn) + PROGRAMS[n])
                                      for n in names))

    try:
        assert [reward for reward, _ in asyncio.run(score_all())] == [0.0] * len(names)
        assert host.effects() == []
    finally:
        host.close()


def test_every_bundled_gold_solution_still_scores_one():
    env = gym.make("rlvr/Code-v0")
    task = env.unwrapped.task
    for index in range(task.size):
        env.reset(seed=0, options={"problem_index": index})
        _, reward, terminated, _, info = env.step(task.gold_completion(task.problem(index, 0)))
        assert (reward, terminated, info["verifier_status"]) == (1.0, True, "ok"), (index, info)


def main() -> None:
    """Print the table: each program, its best reward over the bundled problems, and what it did to the host."""
    import tempfile

    problems = bundled_problems()
    print(f"{'program':58} {'best reward':>11}  host effects")
    for name, body in PROGRAMS.items():
        with tempfile.TemporaryDirectory() as tmp:
            host = Host(Path(tmp))
            results = []
            try:
                for index, fn in problems:
                    try:
                        results.append(episode_reward(index, host.preamble(fn) + body))
                    except Exception as exc:  # what the table exists to show: the caller crashed
                        results.append((0.0, f"raised {type(exc).__name__} in the caller"))
                effects = host.effects()
            finally:
                host.close()
        best = max(reward for reward, _ in results)
        statuses = sorted({status for _, status in results})
        print(f"{name:58} {best:11.2f}  {', '.join(effects) or 'none'}  [{'/'.join(statuses)}]", flush=True)


if __name__ == "__main__":
    main()
