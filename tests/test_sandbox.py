"""The code judge's contract: plain literals and handles on the channel, correct programs pass, and the host's
failures of the moment (no descriptor, a full disk, a sandbox that did not start) are verdicts, never exceptions.
Each case is judged through verifiers.code_reward on HumanEval/0, or sandbox.judge where its output is inspected.
The attacks are in test_sandbox_attacks.py and test_sandbox_kernel.py; the sandbox's world, in sandbox_world.py."""

import math
import os
import resource
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from execution import inside_sandbox, memory_cgroup, sandbox, syscall_filter
from testbed import tasks, verifiers
from sandbox_world import after_the_prompt, no_sandbox_process_left, reward, sandbox_cgroups


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
