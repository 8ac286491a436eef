"""The world a judged program runs in, as the sandbox tests see it from outside: the processes of this process's
sandbox uids, a folder's snapshot, the names the attacks plant, and a completion judged or written after
HumanEval/0's prompt. The fixtures built on it (`has_close_elements`, `outside`) are in conftest.py."""

import os
import resource
import time

from execution import memory_cgroup, sandbox
from testbed import verifiers

SLACK_S = 4.0  # the machine is shared: start-up and teardown may be slow, but never by the program's doing
LIMITS = [getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")]


def sandbox_processes() -> list[int]:
    """Host pids of processes running as one of this process's sandbox uids (as root every sandboxed process has
    one); another pytest worker's sandboxes, alive beside this one's, have uids of their own."""
    found, own = [], sandbox.sandbox_uids(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration):
            continue
        if uid in own:
            found.append(int(pid))
    return found


def no_sandbox_process_left(within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while sandbox_processes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def snapshot(folder) -> dict:
    """Every path under `folder` with its size and modification time (what a write or delete would change)."""
    state = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            info = os.lstat(os.path.join(root, name))
            state[os.path.join(root, name)] = (info.st_size, info.st_mtime_ns)
    return state


PLANTED = ("escaped.txt", "pwned", "stolen", "fill0", "zz_reward.pth")  # names the attacks below write


def reward(example, completion: str, timeout_s: float = 2.0) -> float:
    compile(example.code_prefix + completion, "attack.py", "exec")  # a syntax error would score 0 for nothing
    start = time.monotonic()
    value = verifiers.code_reward(example, completion, timeout_s=timeout_s)
    assert time.monotonic() - start < timeout_s + SLACK_S
    return value


def after_the_prompt(top_level: str, body: str = "    return True") -> str:
    """A completion of HumanEval/0: the function's body, then top-level code and a redefinition."""
    return f"    return True\n\n{top_level}\n\ndef has_close_elements(numbers, threshold):\n{body}\n"


def sandbox_cgroups() -> list[str]:
    """This process's sandboxes' memory cgroups that exist now."""
    where = memory_cgroup.hierarchy()
    mine = f"sandbox-{os.getpid()}-"
    return sorted(name for name in os.listdir(where.parent) if name.startswith(mine)) if where else []
