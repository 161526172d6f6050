"""One cgroup per sandboxed run: a cap on its processes and threads (pids) and on its memory, all of them together.

Why cgroups: rlimits bind per process (RLIMIT_AS: N processes get N times the memory) or per uid (RLIMIT_NPROC,
which does not bind for a uid mapped to root), and tmpfs pages count in no rlimit at all. A cgroup counts every
process and thread of the run, whatever its uid, and the pages of the files it writes to its tmpfs.

The run enters its cgroups before anything of it forks: :func:`entering` prefixes the command with a shell that
writes its own pid to each ``cgroup.procs`` and then execs the command (bwrap, unshare or the runner), so bwrap's
sandbox init and the program are born inside. (Moving the pid in after ``Popen`` is too late: by then bwrap has
forked its children, which stay outside; and ``preexec_fn`` is unsafe in a process with threads.)

Shapes: cgroup v1 (a ``pids`` and a ``memory`` hierarchy, each at this process's own cgroup), or cgroup v2 (this
process's own cgroup, where its ``cgroup.subtree_control`` enables ``pids`` and ``memory``). Swap is off for the run
(v1: ``memory.memsw.limit_in_bytes`` equal to the limit; v2: ``memory.swap.max`` 0). Where no cgroup can be made
(not root, no delegated subtree), one warning says so and the run has its rlimits only.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

PIDS, MEMORY = "pids", "memory"
ENTRY_FAILED = 125  # the entering shell's exit status when it could not join a cgroup
# `sh -c SCRIPT sh FILE... -- COMMAND...`: join each cgroup (its cgroup.procs), then become the command.
ENTER_SCRIPT = 'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; shift; exec "$@"'
NO_CGROUP_RISK = {
    PIDS: "`processes` binds only through RLIMIT_NPROC, per uid, which a sandbox uid mapped to root escapes",
    MEMORY: "`memory_mb` binds per process (RLIMIT_AS): N processes may use N times it, and tmpfs pages count nowhere",
}


@dataclass(frozen=True)
class CgroupRoot:
    """A folder to make run cgroups in: ``version`` 1 or 2, and the controllers this root gives (of pids, memory)."""

    path: str
    version: int
    controllers: frozenset[str]


def cgroup_candidates(mounts: str, own: str) -> list[CgroupRoot]:
    """Where run cgroups could be made, from the text of /proc/self/mounts and /proc/self/cgroup: each v1 hierarchy
    of pids or memory at this process's cgroup there, and this process's v2 cgroup with the controllers its
    subtree enables."""
    own_lines = [line.split(":", 2) for line in own.splitlines() if line.count(":") >= 2]
    candidates = []
    for fields in (line.split() for line in mounts.splitlines()):
        if len(fields) < 4:
            continue
        point, kind, options = fields[1], fields[2], set(fields[3].split(","))
        for _, controllers, path in own_lines:
            base = os.path.join(point, path.lstrip("/"))
            if kind == "cgroup" and controllers:
                wanted = options & set(controllers.split(",")) & {PIDS, MEMORY}
                if wanted:
                    candidates.append(CgroupRoot(base, 1, frozenset(wanted)))
            elif kind == "cgroup2" and controllers == "":
                try:
                    enabled = set(Path(base, "cgroup.subtree_control").read_text().split()) & {PIDS, MEMORY}
                except OSError:
                    continue
                if enabled:
                    candidates.append(CgroupRoot(base, 2, frozenset(enabled)))
    return candidates


def _usable(root: CgroupRoot) -> frozenset[str]:
    """The controllers of ``root`` a run cgroup can really be made with (a probe cgroup made and removed)."""
    probe = os.path.join(root.path, f"rlvr-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(probe)
    except OSError:
        return frozenset()
    try:
        return frozenset(c for c in root.controllers if _set_limit(probe, root.version, c, 1 if c == PIDS else 64 << 20))
    finally:
        _remove(probe)


@functools.cache
def cgroup_roots() -> dict[str, CgroupRoot]:
    """For each controller (pids, memory), the root its run cgroups are made in (probed once); a controller with
    none warns once, naming what then does not bind."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
        own = Path("/proc/self/cgroup").read_text()
    except OSError:
        mounts = own = ""
    roots: dict[str, CgroupRoot] = {}
    for root in cgroup_candidates(mounts, own):
        for controller in _usable(root):
            roots.setdefault(controller, root)
    missing = [controller for controller in (PIDS, MEMORY) if controller not in roots]
    if missing:
        warnings.warn("rewards.code sandbox: no " + " or ".join(missing) + " cgroup can be made here (root or a "
                      "delegated cgroup subtree is needed), so " + "; ".join(NO_CGROUP_RISK[c] for c in missing),
                      RuntimeWarning, stacklevel=2)
    return roots


def _set_limit(path: str, version: int, controller: str, value: int) -> bool:
    """Write one run's limit of ``controller`` into the cgroup at ``path``; False where the kernel refuses it."""
    try:
        if controller == PIDS:
            Path(path, "pids.max").write_text(str(value))
        elif version == 1:
            Path(path, "memory.limit_in_bytes").write_text(str(value))  # before memsw, which may not be below it
            swap = Path(path, "memory.memsw.limit_in_bytes")
            if swap.exists():
                swap.write_text(str(value))
            else:  # no swap accounting in this kernel: keep the run's pages out of swap as far as v1 can
                Path(path, "memory.swappiness").write_text("0")
        else:
            Path(path, "memory.max").write_text(str(value))
            for name, setting in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if Path(path, name).exists():
                    Path(path, name).write_text(setting)
        return True
    except OSError:
        return False


def _remove(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


class RunCgroup:
    """The cgroups of one run (one folder per root: one on v2, a pids and a memory folder on v1), with its limits."""

    _counter = itertools.count()
    _lock = threading.Lock()

    def __init__(self, folders: dict[str, tuple[str, int]]) -> None:
        self.folders = folders  # controller -> (folder, cgroup version)

    @classmethod
    def create(cls, max_pids: int, memory_bytes: int) -> RunCgroup:
        """The run's cgroups under each root of :func:`cgroup_roots` (none where there are no roots)."""
        with cls._lock:
            name = f"rlvr-sandbox-{os.getpid()}-{next(cls._counter)}"
        folders: dict[str, tuple[str, int]] = {}
        made = set()
        for controller, root in cgroup_roots().items():
            path = os.path.join(root.path, name)
            try:
                os.mkdir(path)
            except FileExistsError:  # v2, or v1 hierarchies mounted together: one folder for both
                pass
            except OSError:
                continue
            made.add(path)
            if _set_limit(path, root.version, controller, max_pids if controller == PIDS else memory_bytes):
                folders[controller] = (path, root.version)
        for path in made - {path for path, _ in folders.values()}:
            _remove(path)
        return cls(folders)

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset(self.folders)

    def entering(self, command: list[str]) -> list[str]:
        """``command`` run from inside these cgroups from its first instruction on (see the module's docstring)."""
        procs = sorted({os.path.join(path, "cgroup.procs") for path, _ in self.folders.values()})
        return ["/bin/sh", "-c", ENTER_SCRIPT, "rlvr-enter-cgroup", *procs, "--", *command] if procs else command

    def over_memory(self) -> bool:
        """Whether the kernel killed a process of the run for its memory cap (read before ``kill_all_and_remove``)."""
        if MEMORY not in self.folders:
            return False
        path, version = self.folders[MEMORY]
        try:
            text = Path(path, "memory.oom_control" if version == 1 else "memory.events").read_text()
        except OSError:
            return False
        counts = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
        if "oom_kill" in counts:
            return int(counts["oom_kill"]) > 0
        try:  # v1 kernels before 4.13 have no oom_kill count: hitting the cap is what can be seen
            return int(Path(path, "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def kill_all_and_remove(self) -> None:
        """SIGKILL every process left in the run's cgroups (whatever namespace or session it made), then remove them."""
        for path in sorted({path for path, _ in self.folders.values()}):
            for _ in range(100):
                try:
                    pids = [int(p) for p in Path(path, "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    pids = []
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                if _remove(path):
                    break
                time.sleep(0.01)
