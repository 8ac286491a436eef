"""What runs inside the two sandboxes of a code judgement (sandbox.py, whose docstring has the design): the
candidate, which loads the program and serves calls of its functions; the judge, which runs the data set's
tests against proxies of them; and the channel between the two, on which only plain literals and handles cross.

It imports nothing but what the inside needs: each sandbox imports this file, and each millisecond of its
start-up is paid twice per program.
"""

from __future__ import annotations

import ast
import math
import os
import resource
import select
import sys
import time

MAX_MESSAGE_BYTES = 1 << 20        # a literal longer than this on the channel fails the run
MAX_DEPTH = 100                    # nesting of a literal
DECIMAL_BITS = 10_000              # wider ints cross in hex: Python reads and writes no decimal of 4300+ digits
VERDICT = "verdict: "              # how the judge's last line begins
NOT_JUDGED = "not judged"          # how the reason of a judgement that could not be made begins


# ---- the channel: plain literals and handles as text ---------------------------------------------------------

LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None))


class Handle:
    """A value of the program's that is not a plain literal, as the judge holds it: a number that only the
    candidate resolves. It can be passed back into calls; its truth and comparisons raise, so that no test
    passes on what the program says of its own objects."""

    __slots__ = ("number",)

    def __init__(self, number: int):
        self.number = number

    def __eq__(self, other):
        raise TypeError("the judge does not compare the program's objects")

    __ne__ = __eq__

    def __bool__(self):
        raise TypeError("the program's object has no truth value for the judge")

    def __hash__(self):
        return hash(self.number)

    def __repr__(self):
        return f"handle({self.number})"


def to_literal(value, stash=None, depth: int = 0) -> str:
    """Python source of a plain literal, handles written `handle(n)`; TypeError for anything else (subclasses
    included: their methods could lie) unless `stash` turns it into a handle's number (the candidate's
    results); ValueError when nested deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise ValueError(f"literal nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind is float and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if kind is int and value.bit_length() > DECIMAL_BITS:
        return hex(value)
    if kind is complex:  # repr writes complex(0, inf) as `infj`, which is no literal
        return f"complex({to_literal(value.real)}, {to_literal(value.imag)})"
    if kind in LITERAL_TYPES or kind is Handle:
        return repr(value)
    if kind in (list, tuple, set, frozenset):
        items = ", ".join(to_literal(v, stash, depth + 1) for v in value)
        if kind is list:
            return f"[{items}]"
        if kind is tuple:
            return f"({items}{',' if len(value) == 1 else ''})"
        return f"{kind.__name__}([{items}])"
    if kind is dict:
        return "{" + ", ".join(f"{to_literal(k, stash, depth + 1)}: {to_literal(v, stash, depth + 1)}"
                               for k, v in value.items()) + "}"
    if stash is not None:
        return f"handle({stash(value)})"
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
        if kind == "handle" and len(args) == 1 and isinstance(args[0], ast.Constant) and type(args[0].value) is int:
            return Handle(args[0].value)
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

    def send(self, value, stash=None) -> None:
        data = (to_literal(value, stash) + "\n").encode("utf-8", errors="surrogatepass")
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


def describe(error: BaseException) -> str:
    """'Type: message' of an exception, at most 300 characters; never raises (a message may fail to print)."""
    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:
        text = type(error).__name__
    return text[:300]


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


def _resolve(value, objects: list):
    """`value` with each handle in it replaced by the candidate's object of that number."""
    kind = type(value)
    if kind is Handle:
        return objects[value.number]
    if kind in (list, tuple, set, frozenset):
        return kind(_resolve(v, objects) for v in value)
    if kind is dict:
        return {_resolve(k, objects): _resolve(v, objects) for k, v in value.items()}
    return value


def serve_candidate(channel: Channel, program: str, setup: str, setup_names: list[str]) -> None:
    """Run the program and then the trusted setup once, keeping the values the setup binds as the objects of
    handles 0, 1, ...; then answer calls (name, args, kwargs) with ('ok', result) or ('raised', why)."""
    channel.send(("started", None))  # before any of the program runs: the judge knows the sandbox started
    namespace, objects = {"__name__": "__main__"}, []

    def stash(value) -> int:
        objects.append(value)
        return len(objects) - 1

    def reply(message, stash=None) -> None:
        # the candidate is stopped as soon as the judge ends, which may be right after this reply: what the program
        # printed must be in the output pipe by then, not in a buffer that only exit would have flushed
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # the program's own stream, closed or replaced: its output is its affair
                pass
        channel.send(message, stash)

    try:
        exec(compile(program, "program.py", "exec"), namespace)
        exec(compile(setup, "setup.py", "exec"), namespace)
        objects.extend(namespace[name] for name in setup_names)
    except BaseException as error:  # SystemExit too: the program's end is not its verdict
        reply(("load failed", describe(error)))
        return
    reply(("ready", None))
    while True:
        try:
            name, args, kwargs = channel.receive()
        except EOFError:  # the judge is done
            return
        try:
            reply(("ok", _plain(namespace[name](*_resolve(args, objects), **_resolve(kwargs, objects)))), stash)
        except BaseException as error:
            reply(("raised", describe(error)))


class CandidateError(Exception):
    """A call of the candidate raised."""


def fail(reason: str) -> None:
    """The judge's verdict when the candidate stopped answering or broke the protocol: no test code catches it."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    one_line = " ".join(reason.splitlines())[:1000]  # the candidate may have written part of it
    os.write(1, f"\n{VERDICT}{one_line}\n".encode(errors="replace"))
    os._exit(1)


TEXT_REPLIES = ("raised", "load failed")


def receive_reply(channel: Channel, waiting_for: str, kinds: tuple[str, ...]) -> tuple[str, object]:
    """The candidate's next message, a (kind, value) pair of one of `kinds`, or the judge fails."""
    try:
        message = channel.receive()
    except TimeoutError:
        fail(f"timeout: {waiting_for}")
    except EOFError:
        fail(f"{NOT_JUDGED}: the candidate's sandbox did not start" if "started" in kinds else
             "the candidate broke the channel: it closed it")
    except (OSError, ValueError) as error:
        fail(f"the candidate broke the channel: {describe(error)}")
    if not (type(message) is tuple and len(message) == 2 and type(message[0]) is str and message[0] in kinds
            and (message[0] not in TEXT_REPLIES or type(message[1]) is str)):
        fail(f"the candidate broke the channel: a {type(message).__name__} where {' or '.join(kinds)} was due")
    return message


def candidate_proxy(channel: Channel, name: str):
    def call(*args, **kwargs):
        try:
            channel.send((name, args, kwargs))
        except OSError as error:
            fail(f"the candidate broke the channel: {describe(error)}")
        kind, value = receive_reply(channel, f"{name} did not answer in time", ("ok", "raised"))
        if kind == "ok":
            return value
        raise CandidateError(f"{name}{to_literal(args)[:200]} -> {value}")
    call.__name__ = name
    return call


def run_judge(channel: Channel, tests: str, trusted_prefix: str, entry_points: list[str],
              setup_names: list[str]) -> None:
    """Wait for the candidate, then run the trusted prefix and the tests, with the entry points proxied and the
    setup's names bound to handles 0, 1, ... of the candidate's; the last line written is the verdict."""
    receive_reply(channel, "the candidate's sandbox did not start in time", ("started",))
    kind, why = receive_reply(channel, "the program did not load in time", ("ready", "load failed"))
    if kind != "ready":
        fail(f"the program failed to load: {why}")
    namespace = {"__name__": "__judge__"}
    exec(compile(trusted_prefix, "prompt.py", "exec"), namespace)
    namespace.update({name: candidate_proxy(channel, name) for name in entry_points})
    namespace.update({name: Handle(number) for number, name in enumerate(setup_names)})
    try:
        exec(compile(tests, "tests.py", "exec"), namespace)
    except BaseException as error:
        fail(f"failed: {describe(error)}")
    sys.stdout.flush()
    os.write(1, f"\n{VERDICT}passed\n".encode())
    os._exit(0)


def _read_spec() -> dict:
    """What this sandbox runs, which `judge` hands over as stdin; stdin is /dev/null from then on."""
    chunks = []
    while chunk := os.read(0, 1 << 20):
        chunks.append(chunk)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return ast.literal_eval(b"".join(chunks).decode())


def child_main(argv: list[str]) -> None:
    """Entry point inside a sandbox: argv = role, uid, read fd, write fd, deadline in seconds, limits as
    'NAME=value' pairs; stdin holds the spec (see `judge`)."""
    role, uid, read_fd, write_fd, seconds, *limits = argv
    deadline = time.monotonic() + float(seconds)
    spec = _read_spec()
    _enter(int(uid), [(getattr(resource, k), int(v)) for k, v in (item.split("=") for item in limits)])
    channel = Channel(int(read_fd), int(write_fd), deadline)
    if role == "candidate":
        serve_candidate(channel, spec["program"], spec["setup"], spec["setup_names"])
        return
    try:
        run_judge(channel, spec["tests"], spec["prefix"], spec["entry_points"], spec["setup_names"])
    except BaseException as error:  # the trusted prefix failed, or the judge itself: still a verdict
        fail(f"the judge failed: {describe(error)}")
