import os
import socket
import subprocess
import sys
import time

import pytest

import sandbox

SLACK_S = 4.0  # the machine is shared: startup and teardown may be slow, but never by the program's doing


def run(source: str, timeout_s: float = 1.0) -> sandbox.RunResult:
    start = time.monotonic()
    result = sandbox.run_program(source, timeout_s=timeout_s)
    assert time.monotonic() - start < timeout_s + SLACK_S
    return result


def test_a_correct_program_passes_and_a_failing_one_does_not():
    assert run("def add(a, b):\n    return a + b\n\nassert add(2, 3) == 5\nprint('fine')").passed
    failing = run("def add(a, b):\n    return a - b\n\nassert add(2, 3) == 5")
    assert not failing.passed and failing.reason == "exit status 1" and "AssertionError" in failing.output


def test_the_program_can_use_its_own_directory_and_the_standard_library():
    source = ("import collections, heapq, json, math, re, tempfile\n"
              "open('notes.txt', 'w').write('x' * 10)\n"
              "assert open('notes.txt').read() == 'x' * 10\n"
              "with tempfile.NamedTemporaryFile() as f:\n    f.write(b'y')\n"
              "assert heapq.nlargest(2, [3, 1, 4]) == [4, 3]")
    assert run(source).passed


@pytest.mark.parametrize("source, reason", [
    ("while True:\n    pass", "timeout"),                                        # infinite loop
    ("import time\ntime.sleep(60)", "timeout"),                                  # sleeps past the wall clock
    ("import os\nwhile True:\n    os.fork()", "forbidden"),                       # fork bomb
    ("import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])", "forbidden"),
    ("import os\nos.system('echo hi')", "forbidden"),
    ("while True:\n    print('x' * 10000)", "output limit"),                     # huge output
    ("import faulthandler\nfaulthandler._sigsegv()", "killed by signal 11"),       # crash
    ("import ctypes", "forbidden"),
    ("import sys\nsys.exit(0)", "exit status 1"),                                 # early exits never pass
    ("exit()", "exit status 1"),
    ("raise SystemExit", "exit status 1"),
    ("import os\nos._exit(0)", "exit status 0 before the end"),
])
def test_hostile_programs_fail_within_the_time_limit(source, reason):
    result = run(source)
    assert not result.passed and result.reason == reason
    assert len(result.output) <= 2000


def test_a_memory_bomb_fails_quickly():
    for source in ("x = bytearray(10 ** 10)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))"):
        result = run(source, timeout_s=5.0)
        assert not result.passed and "MemoryError" in result.output and result.seconds < 5.0


def test_writes_outside_the_directory_are_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    attempts = [f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')",
                f"open({str(victim)!r}, 'a').write('x')",
                f"import os\nos.remove({str(victim)!r})",
                f"import os\nos.rename({str(victim)!r}, 'stolen.txt')",
                f"import os\nos.open({str(tmp_path / 'raw.txt')!r}, os.O_WRONLY | os.O_CREAT)",
                f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
                "import os\nos.chdir('/')\nopen('tmp/escaped-sandbox.txt', 'w')"]
    for source in attempts:
        result = run(source)
        assert not result.passed and result.reason == "forbidden", source
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]
    assert not os.path.exists("/tmp/escaped-sandbox.txt")


def test_the_disk_a_program_fills_is_bounded():
    one_file = run("open('big.bin', 'wb').write(b'x' * (2 << 20))")
    assert not one_file.passed and "File too large" in one_file.output           # RLIMIT_FSIZE: 1 MiB per file
    many_files = run("for i in range(1000):\n    open(f'f{i}.bin', 'wb').write(b'x' * 1000)")
    assert not many_files.passed and "more than 64 files" in many_files.output


@pytest.mark.skipif(os.geteuid() == 0, reason="the kernel does not enforce RLIMIT_NPROC for root")
def test_a_non_root_program_starts_no_threads_or_processes():
    result = run("import threading\nthreading.Thread(target=print).start()")
    assert not result.passed and "can't start new thread" in result.output


def test_reading_outside_the_directory_is_allowed():
    assert run(f"assert open({os.__file__!r}).read(1) is not None").passed


@pytest.mark.parametrize("namespace", [True, False], ids=["unshare-if-available", "socket-refusal-only"])
def test_no_connection_reaches_a_listener_on_the_host(namespace, monkeypatch):
    if not namespace:
        monkeypatch.setattr(sandbox, "network_isolation", lambda: ())
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        result = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')")
        assert not result.passed
        with pytest.raises(TimeoutError):
            listener.accept()


def test_the_child_has_its_own_network_namespace_where_unshare_works():
    if not sandbox.network_isolation():
        pytest.skip("unshare cannot create a network namespace here; socket creation is refused instead")
    result = run("import os\nprint(os.readlink('/proc/self/ns/net'))")
    assert result.passed
    assert os.readlink("/proc/self/ns/net") not in result.output and "net:[" in result.output


def test_other_processes_cannot_be_signalled():
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        for target in (bystander.pid, os.getpid()):
            result = run(f"import os, signal\nos.kill({target}, signal.SIGKILL)")
            assert not result.passed and result.reason == "forbidden"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_the_caller_keeps_running_after_many_hostile_runs():
    results = [sandbox.run_program(source, timeout_s=0.5) for source in
               ("import os\nos.fork()", "while True:\n    print('x' * 10000)", "import os\nos._exit(3)")]
    assert [r.reason for r in results] == ["forbidden", "output limit", "exit status 3"]
    assert run("assert 1 + 1 == 2").passed  # the parent process still spawns and reads children normally


@pytest.mark.parametrize("source", ["\x00", "def f(:\n", "\ud800 = 1", "", "\n\n"])
def test_malformed_source_never_raises(source):
    result = run(source)
    assert result.passed == (source.strip() == "")


def test_bad_limits_are_refused():
    for kwargs in ({"timeout_s": 0}, {"memory_mb": -1}, {"output_limit_bytes": 0}):
        with pytest.raises(ValueError, match="limits must be positive"):
            sandbox.run_program("pass", **kwargs)


def test_the_child_uses_this_interpreter():
    assert run(f"import sys\nassert sys.version_info[:2] == {tuple(sys.version_info[:2])}").passed
