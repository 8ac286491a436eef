"""Running untrusted code for a reward: the code tasks' verifier (proposal §3.1 task domains: HumanEval, MBPP).

A policy's completion is untrusted code (DESIGN.md §6). `run_program` runs one Python program in a child process
and says whether it ran to its end; the code tasks in tasks.py build the program (the completion followed by
the benchmark's tests) and give reward 1 exactly when it did. Whatever the program does, the caller gets a
`RunResult` back within about `timeout_s` and is not otherwise affected: a crash, an infinite loop, a fork
bomb, a huge output, a memory bomb, an attempt to write outside its directory, to open a socket, to signal
another process, or to exit early with status 0 all give `passed=False`.

Layers, outermost first:

- a fresh throw-away working directory (HOME and TMPDIR point into it), removed afterwards; stdin is
  /dev/null; stdout and stderr go to one file in that directory, so output never accumulates in the caller;
- a new session, so the whole process group is killed (SIGKILL) at the wall-clock limit and at the end;
- no network: when `unshare` works here without asking for privileges (probed once), the child runs in a fresh
  network namespace (`unshare --net`, plus `--user --map-root-user` when not root) whose only interface is a
  loopback that is down; in every case socket creation is refused inside the child (below);
- kernel limits set in the child before the program runs (resource.setrlimit): RLIMIT_AS (memory),
  RLIMIT_CPU, RLIMIT_FSIZE (bounds the output file and each file the program writes), RLIMIT_NPROC=1 (no new
  processes or threads; the kernel does not enforce it for uid 0) and RLIMIT_CORE=0 (no core dumps);
- an audit hook (PEP 578) installed before the program runs, which ends the child at once (exit status
  VIOLATION_STATUS) on socket creation, process creation (fork, exec, spawn, system, subprocess), signals sent
  to other processes, ctypes, any write, delete, rename or permission change outside the working directory,
  and opening more than MAX_FILES_WRITTEN files for writing (with RLIMIT_FSIZE, a bound on the disk it fills).
  When the caller is root, the hook is what stops process creation and writes outside the directory. It is a
  tripwire for what a policy plausibly emits, not a security boundary against code written to escape it: run
  training on a machine where the trainer's own files are the only thing at risk;
- success is proven by a per-run nonce: the child reads it from stdin before the program runs, keeps it in a
  local of the function that runs the program, and writes it after the program returns, so `sys.exit(0)`,
  `os._exit(0)` or any other early exit fails. (Code written to read its caller's frame could find it; frame
  introspection stays allowed because the standard library uses it, e.g. enum and namedtuple.)

The child is the same interpreter in isolated mode without bytecode writing (`python -I -B`), with the standard
library and the environment's site-packages importable (RLIMIT_AS keeps large imports out).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

VIOLATION_STATUS = 86
MAX_FILES_WRITTEN = 64  # with RLIMIT_FSIZE per file, this bounds the disk a program can fill
OUTPUT_NAME = "output.txt"
PROGRAM_NAME = "program.py"

# Runs in the child: limits, then the audit hook, then the program. It is passed with -c, the settings as argv.
CHILD = r'''
import os, resource, sys

def forbid(reason):
    os.write(2, f"\nsandbox: forbidden: {reason}\n".encode())
    os._exit(STATUS)

def is_inside(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fsdecode(path))
    return real == ROOT or real.startswith(ROOT + os.sep)

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PATH_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.link", "os.symlink",
               "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "shutil.rmtree", "shutil.move"}
REFUSED = ("socket.", "ctypes.", "subprocess.", "os.fork", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
           "os.kill", "os.killpg", "os.setsid", "signal.pthread_kill")
REFUSED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing"}

files_written = 0

def hook(event, args):
    global files_written
    if event.startswith(REFUSED):
        forbid(event)
    if event == "import" and args[0] in REFUSED_IMPORTS:
        forbid(f"import {args[0]}")
    if event == "open" and (any(c in (args[1] or "") for c in "wax+") or (args[2] or 0) & WRITE_FLAGS):
        if not is_inside(args[0]):
            forbid(f"write to {args[0]}")
        files_written += 1
        if files_written > MAX_FILES:
            forbid(f"more than {MAX_FILES} files opened for writing")
    if event in PATH_EVENTS and not all(is_inside(a) for a in args if isinstance(a, (str, bytes, os.PathLike))):
        forbid(f"{event} outside the working directory")

def main():
    nonce = sys.stdin.readline().strip()
    with open(PROGRAM) as f:
        source = f.read()
    for limit, value in LIMITS:
        resource.setrlimit(limit, (value, value))
    sys.addaudithook(hook)
    try:
        exec(compile(source, PROGRAM, "exec"), {"__name__": "__main__"})
    except BaseException as error:
        os.write(2, f"\n{type(error).__name__}: {error}\n".encode(errors="replace"))
        os._exit(1)
    sys.stdout.flush()
    os.write(1, f"\n{nonce}\n".encode())
    os._exit(0)

ROOT, PROGRAM, STATUS, MAX_FILES = os.path.realpath(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
LIMITS = [(getattr(resource, name), int(value)) for name, value in zip(sys.argv[5::2], sys.argv[6::2])]
main()
'''


@dataclass(frozen=True)
class RunResult:
    passed: bool
    """the program ran to its end within every limit"""
    status: int | None
    """the child's exit status; negative: killed by that signal; None: killed at the wall-clock limit"""
    reason: str
    """'passed', 'timeout', 'forbidden', 'output limit', 'killed by signal N', 'exit status N' or
    'exit status 0 before the end'"""
    output: str
    """the tail of the program's stdout and stderr together, for diagnosis"""
    seconds: float


@functools.cache
def network_isolation() -> tuple[str, ...]:
    """The `unshare` prefix that gives the child a fresh network namespace, or () where that is unavailable."""
    flags = ("--net",) if os.geteuid() == 0 else ("--user", "--map-root-user", "--net")
    command = (shutil.which("unshare") or "unshare", *flags)
    try:
        probe = subprocess.run([*command, "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return command if probe.returncode == 0 else ()


def _limits(timeout_s: float, memory_mb: int, output_limit_bytes: int) -> list[tuple[str, int]]:
    return [("RLIMIT_AS", memory_mb << 20), ("RLIMIT_CPU", int(timeout_s) + 1),
            ("RLIMIT_FSIZE", output_limit_bytes), ("RLIMIT_NPROC", 1), ("RLIMIT_CORE", 0)]


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _verdict(status: int | None, output: str, nonce: str, output_full: bool) -> tuple[bool, str]:
    if output_full:
        return False, "output limit"
    if status is None:
        return False, "timeout"
    if status == VIOLATION_STATUS:
        return False, "forbidden"
    if status < 0:
        return False, f"killed by signal {-status}"
    if status != 0:
        return False, f"exit status {status}"
    # status 0 without the nonce: the program left early (os._exit(0) and the like)
    return (True, "passed") if output.endswith(f"\n{nonce}\n") else (False, "exit status 0 before the end")


def run_program(source: str, timeout_s: float = 5.0, memory_mb: int = 512, output_limit_bytes: int = 1 << 20,
                tail_chars: int = 2000) -> RunResult:
    """Run the Python program `source` in the sandbox described above; never raises on the program's account."""
    if timeout_s <= 0 or memory_mb <= 0 or output_limit_bytes <= 0:
        raise ValueError(f"limits must be positive, got timeout_s={timeout_s}, memory_mb={memory_mb}, "
                         f"output_limit_bytes={output_limit_bytes}")
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="sandbox-", ignore_cleanup_errors=True) as workdir:
        program = Path(workdir, PROGRAM_NAME)
        program.write_text(source, errors="replace")  # a lone surrogate must not raise here
        settings = [str(x) for pair in _limits(timeout_s, memory_mb, output_limit_bytes) for x in pair]
        command = [*network_isolation(), sys.executable, "-I", "-B", "-c", CHILD, workdir, str(program),
                   str(VIOLATION_STATUS), str(MAX_FILES_WRITTEN), *settings]
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        start = time.monotonic()
        with open(Path(workdir, OUTPUT_NAME), "w+b") as output_file:
            process = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=output_file,
                                       stderr=output_file, start_new_session=True)
            try:
                process.communicate(f"{nonce}\n".encode(), timeout=timeout_s)
                status = process.returncode
            except subprocess.TimeoutExpired:
                status = None
            finally:
                _kill_group(process)
                process.wait()
            seconds = time.monotonic() - start
            size = os.fstat(output_file.fileno()).st_size
            output_file.seek(max(0, size - 4 * tail_chars))
            output = output_file.read().decode(errors="replace")
    passed, reason = _verdict(status, output, nonce, size >= output_limit_bytes)
    return RunResult(passed, status, reason, output[-tail_chars:].replace(nonce, "<nonce>"), seconds)
