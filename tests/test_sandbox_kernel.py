"""Attacks through the kernel score 0 and leave nothing behind: no key, SysV object or cgroup, no memory held
outside a sandbox's address space, no channel between two sandboxes. Each attack is a completion of HumanEval/0 that
answers right exactly when its attack worked."""

import ctypes
import os
import time
from pathlib import Path

import pyseccomp
import pytest

from execution import memory_cgroup, sandbox, syscall_filter
from sandbox_world import after_the_prompt, reward, sandbox_cgroups


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
import fcntl, mmap, signal, struct
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
