"""The system-call filter of every sandboxed process (sandbox.py): an allowlist of what a pure-Python program
needs (the interpreter, its standard library, numpy, threads, a fork), compiled by libseccomp (through its
ctypes bindings, pyseccomp) to the seccomp BPF program that bwrap loads with `--seccomp` just before it starts
the interpreter. The filter is inherited by every process the program starts and cannot be lifted.

Anything not allowed fails with EPERM, so Python raises PermissionError and the program goes on (or fails its
tests) instead of being killed. Left out, among much else:
- the kernel keyring (add_key, keyctl, request_key), whose keys no namespace isolates and which outlive the
  sandbox: a guesser could keep there what earlier judgements told it;
- SysV IPC and POSIX message queues, memory the kernel holds outside any process's address space;
- fallocate, flock, inotify, fanotify, mincore, and the fcntl commands that lock, lease or watch a file
  (F_SETLK, F_OFD_SETLK, F_SETLEASE, F_NOTIFY): each is a channel between sandboxes through the read-only files
  they share, or disk reserved past the output cap;
- new namespaces (unshare, setns, clone with a CLONE_NEW* flag), mount and the new mount API, chroot: a
  nested user namespace would give the program capabilities over a tmpfs or a network of its own;
- sockets of every family (socket itself; only socketpair of AF_UNIX, which asyncio uses for its wake-up pipe):
  no raw packets, netlink (nf_tables), or unix sockets bound to a path;
- io_uring, userfaultfd, perf_event_open, bpf, ptrace, process_vm_readv / writev, kcmp, pidfd_getfd,
  memfd_create, NUMA policy, module loading, reboot, and the like;
- ioctl other than the few requests the standard library makes (isatty, non-blocking and close-on-exec flags,
  bytes readable, terminal size).

clone3 keeps its flags in memory that a filter cannot read, so it fails with ENOSYS instead: glibc then falls
back to clone, whose flags the filter checks. System calls of another ABI (x32, or i386 through int 0x80)
fail with EPERM too.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import termios

CLONE_NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

ALLOWED = (
    # memory
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "msync",
    # descriptors
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "lseek", "close", "close_range", "dup", "dup2", "dup3", "fstat", "fstatfs", "ftruncate", "fsync",
    "fdatasync", "fchmod", "fchdir", "getdents", "getdents64", "sendfile", "pipe", "pipe2",
    "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2",
    # paths (the only writable place is the sandbox's own /tmp), and reading extended attributes (shutil.copy2)
    "open", "openat", "stat", "lstat", "newfstatat", "statx", "statfs", "access", "faccessat", "faccessat2",
    "readlink", "readlinkat", "getcwd", "chdir", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename",
    "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmodat", "truncate",
    "utimensat", "umask", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    # the sockets of a socketpair (socket and socketpair themselves are below)
    "sendto", "recvfrom", "sendmsg", "recvmsg", "shutdown", "getsockname", "getpeername", "getsockopt",
    "setsockopt",
    # processes and threads (clone is below)
    "fork", "vfork", "execve", "exit", "exit_group", "wait4", "waitid", "kill", "tgkill", "tkill",
    "getpid", "getppid", "gettid", "getpgid", "getpgrp", "setpgid", "getsid", "setsid", "set_tid_address",
    "set_robust_list", "rseq", "futex", "sched_yield", "sched_getaffinity", "arch_prctl",
    # identity and limits: sandbox.py drops to the sandbox uid and sets its limits after the filter is in place
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid", "setgid",
    "setgroups", "getrlimit", "setrlimit", "prlimit64", "getrusage", "times", "uname", "sysinfo", "getrandom",
    # signals and time
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait", "rt_sigsuspend",
    "sigaltstack", "pause", "alarm", "getitimer", "setitimer", "restart_syscall", "nanosleep",
    "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "time",
)
FCNTL_COMMANDS = (0, 1, 2, 3, 4, 1030)  # F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC
IOCTL_REQUESTS = (termios.TCGETS, termios.FIONBIO, termios.FIOCLEX, termios.FIONCLEX, termios.FIONREAD,
                  termios.TIOCGWINSZ)


class FilterUnavailable(RuntimeError):
    """libseccomp or its bindings are missing, or cannot compile the filter for this machine."""


def _libseccomp():
    try:
        import pyseccomp  # loads the system's libseccomp.so.2 at import
    except (ImportError, RuntimeError, OSError) as error:
        raise FilterUnavailable(f"no libseccomp: {error} (pip install -r requirements.txt; the library itself is "
                                f"Debian's libseccomp2)") from None
    return pyseccomp


def _exported(rules) -> bytes:
    read_fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    with open(read_fd, "w+b") as exported:
        try:
            rules.export_bpf(exported)
        except OSError as error:
            raise FilterUnavailable(f"libseccomp could not compile the filter: {error}") from None
        exported.seek(0)
        return exported.read()


@functools.cache
def bpf_program() -> bytes:
    """The filter as a BPF program, the form bwrap's --seccomp reads from a descriptor."""
    seccomp = _libseccomp()
    deny = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(deny)
    rules.set_attr(seccomp.Attr.ACT_BADARCH, deny)
    rules.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)  # a binary tree of system call numbers, not a linear scan
    for name in ALLOWED:
        rules.add_rule(seccomp.ALLOW, _number(seccomp, name))
    rules.add_rule(seccomp.ALLOW, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEW_NAMESPACES, 0))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.add_rule(seccomp.ALLOW, "socketpair", seccomp.Arg(0, seccomp.EQ, socket.AF_UNIX))
    for command in FCNTL_COMMANDS:
        rules.add_rule(seccomp.ALLOW, "fcntl", seccomp.Arg(1, seccomp.EQ, command))
    for request in IOCTL_REQUESTS:
        rules.add_rule(seccomp.ALLOW, "ioctl", seccomp.Arg(1, seccomp.EQ, request))
    return _exported(rules)


def allow_everything() -> bytes:
    """A BPF program that allows every call: what the tests and the benchmark put in the filter's place to see
    the other layers hold alone, and what the filter costs. sandbox.py never loads it."""
    seccomp = _libseccomp()
    return _exported(seccomp.SyscallFilter(seccomp.ALLOW))


def _number(seccomp, name: str) -> int:
    """The system call's number here; a name libseccomp does not know is a mistake in ALLOWED. Calls that this
    architecture lacks (open, pause on arm64) resolve to libseccomp's pseudo numbers, which it leaves out."""
    number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
    if number == -1:
        raise FilterUnavailable(f"libseccomp knows no system call {name!r}")
    return number
