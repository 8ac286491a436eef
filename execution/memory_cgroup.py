"""A memory cgroup of its own for each sandbox (sandbox.py), so that all the memory the kernel charges to the
sandbox's processes counts against one cap: their pages, the tmpfs of its /tmp, pipe buffers, page tables, and
the kernel's objects for its files, folders and namespaces, none of which is in a process's address space. Past
the cap the kernel's OOM killer picks a process of that sandbox, never the trainer.

The cgroups are children of the trainer's own: in the cgroup v2 hierarchy where the memory controller is
enabled for its children there (at the root, or a delegated subtree's), else in the v1 memory hierarchy where
it is mounted writable (as root on a v1 host). `create` returns None where neither is allowed (an unprivileged
user without delegation, most containers): the sandboxes then run with their per-process limits only (see
sandbox.py).
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time
from typing import NamedTuple

REMOVE_WITHIN_S = 2.0  # a sandbox's processes take a moment to leave after its outermost one is reaped

_names = itertools.count()  # of this process's cgroups: sandbox-<pid>-<n>


class Hierarchy(NamedTuple):
    parent: str
    """the trainer's cgroup, under which each sandbox gets its own"""
    limit: str
    """the file of the memory cap"""
    swap: str
    """the file that keeps the sandbox out of swap"""
    swap_counts_memory: bool
    """v1's memsw counts memory and swap together, so it gets the cap itself; v2's swap.max gets 0"""
    events: str
    """the file whose 'oom_kill N' line counts the processes the kernel killed at the cap"""


V2 = ("memory.max", "memory.swap.max", False, "memory.events")
V1 = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", True, "memory.oom_control")


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root inside the hierarchy, mount point, file system type, super options) of each cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields, _, rest = line.partition(" - ")
            kind, _, options = rest.split()[:3]
            if kind in ("cgroup", "cgroup2"):
                root, mount_point = fields.split()[3:5]
                found.append((root, mount_point, kind, set(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path in each hierarchy, keyed 'cgroup2' or by the v1 controller ('memory')."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            for name in (["cgroup2"] if number == "0" and not controllers else controllers.split(",")):
                paths[name] = path
    return paths


def _folder(mount_point: str, mount_root: str, path: str) -> str:
    inside = os.path.relpath(path, mount_root)
    return mount_point if inside == "." else os.path.join(mount_point, inside)


def _v2_parent(mounts, paths) -> str | None:
    """The trainer's v2 cgroup where its children get the memory controller (at the root or a delegated
    subtree's; enabling it is left to whoever set the host up)."""
    for root, mount_point, kind, _ in mounts:
        if kind == "cgroup2" and "cgroup2" in paths:
            folder = _folder(mount_point, root, paths["cgroup2"])
            try:
                with open(os.path.join(folder, "cgroup.subtree_control")) as f:
                    return folder if "memory" in f.read().split() else None
            except OSError:
                return None
    return None


def _v1_parent(mounts, paths) -> str | None:
    for root, mount_point, kind, options in mounts:
        if kind == "cgroup" and "memory" in options and "memory" in paths:
            return _folder(mount_point, root, paths["memory"])
    return None


@functools.cache
def hierarchy() -> Hierarchy | None:
    """Where sandboxes' cgroups can be made here, found once: v2 first, else v1, else None."""
    try:
        mounts, paths = _mounts(), _own_paths()
    except (OSError, ValueError):
        return None
    for parent, files in ((_v2_parent(mounts, paths), V2), (_v1_parent(mounts, paths), V1)):
        if parent is not None and _can_create(Hierarchy(parent, *files)):
            return Hierarchy(parent, *files)
    return None


def _can_create(where: Hierarchy) -> bool:
    probe = os.path.join(where.parent, f"sandbox-{os.getpid()}-{next(_names)}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    found = os.path.exists(os.path.join(probe, where.limit))
    os.rmdir(probe)
    return found


def create(limit_bytes: int) -> str | None:
    """A new cgroup capped at `limit_bytes` of memory, swap none; None where this host gives none. Raises OSError
    where one could be made but this one cannot (no memory, too many cgroups): that judgement is not made."""
    where = hierarchy()
    if where is None:
        return None
    folder = os.path.join(where.parent, f"sandbox-{os.getpid()}-{next(_names)}")
    os.mkdir(folder)
    try:
        _write(folder, where.limit, str(limit_bytes))
        if os.path.exists(os.path.join(folder, where.swap)):  # absent without swap accounting: nothing to swap to
            _write(folder, where.swap, str(limit_bytes if where.swap_counts_memory else 0))
    except OSError:
        os.rmdir(folder)
        raise
    return folder


def _write(folder: str, name: str, value: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(value)


def launched_inside(folder: str, command: list[str]) -> list[str]:
    """`command` started inside the cgroup: a shell moves itself in and then becomes the command, so that every
    process of the sandbox is born there (a process moved later would leave its children behind)."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(folder, "cgroup.procs"), *command]


def ran_out_of_memory(folder: str) -> bool:
    """Whether the kernel killed a process of this cgroup at its cap."""
    try:
        with open(os.path.join(folder, hierarchy().events)) as f:
            return any(line.split() != ["oom_kill", "0"] for line in f if line.startswith("oom_kill "))
    except OSError:
        return False


def _kill_members(folder: str) -> None:
    """SIGKILL every process still in the cgroup: one that missed the death of its sandbox's outermost process
    (a sandbox stopped while bwrap was still setting it up) would otherwise wait there for ever."""
    procs = os.path.join(folder, "cgroup.procs")
    with open(procs) as f:
        pids = [int(pid) for pid in f.read().split()]
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            with open(procs) as f:  # still a member once held by its pidfd: not a newcomer reusing the pid
                if str(pid) in f.read().split():
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)


def remove(folder: str, within_s: float = REMOVE_WITHIN_S) -> bool:
    """Kill what is left of the sandbox and remove its cgroup; False where that did not succeed within `within_s`
    (a stuck kernel, or one slow to reap what the OOM killer took)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.rmdir(folder)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            _kill_members(folder)   # before the deadline's check: a retry given no time (within_s=0) kills too
            if time.monotonic() > deadline:
                return False
        time.sleep(0.002)
