"""Where the benchmark tasks' data come from (testbed/data.py), and how each source fails: a partial or un-LFS'd
local copy, a copy without the split, a malformed JSON line, an unreachable hub or offline mode, each refused at once
with what to do; the hub probe is bounded and counts any HTTP answer."""

import http.server
import json
import socket
import threading
import time

import pytest

from args import Args
from testbed import data as data_sources  # as test_benchmarks.py names it, where `data` is a fixture
from testbed import tasks
from test_benchmarks import GSM8K, MATH, MATH_TEST, MBPP, write_jsonl, write_parquet


def test_a_partial_math_copy_is_refused_unless_one_subject_is_chosen(tmp_path):
    write_parquet(tmp_path / "algebra/train-00000-of-00001.parquet", MATH[1:2])
    write_parquet(tmp_path / "algebra/test-00000-of-00001.parquet", MATH_TEST)
    with pytest.raises(data_sources.DataUnavailable, match=r"1 of its 7 folders \(algebra\) and lacks counting_and"):
        tasks.load_task("math", 0, 10, 10, data_dir=str(tmp_path))
    task = tasks.load_task("math", 0, 10, 10, data_dir=str(tmp_path / "algebra"))   # one subject, on purpose
    assert [e.question for e in task.train] == [MATH[1]["problem"]]
    assert task.reward(task.train[0], task.train[0].reference) == 1.0
    assert task.reward(task.train[0], "so $x = \\boxed{5}$") == 0.0


def test_a_clone_without_git_lfs_says_so(tmp_path):
    pointer = ("version https://git-lfs.github.com/spec/v1\n"
               "oid sha256:4b2e06e1b7a5d83d3a1fe4c1b5d2c1b4e0b6f8e8c4a2f6c7c5e3a1d9b7f5e3c1\nsize 2306545\n")
    for split in ("train", "test"):
        (tmp_path / "main").mkdir(exist_ok=True)
        (tmp_path / f"main/{split}-00000-of-00001.parquet").write_text(pointer)
    with pytest.raises(data_sources.DataUnavailable,
                       match=r"GSM8K: 1 of the 1 data files .* Git LFS pointers.*git lfs pull"):
        tasks.load_task("gsm8k", 0, 10, 10, data_dir=str(tmp_path))


def test_a_local_copy_without_the_split_names_the_data_set_and_the_option(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", MBPP)
    with pytest.raises(data_sources.DataUnavailable, match=r"MBPP is not available: .* has no test split.*--data-dir"):
        tasks.load_task("mbpp", 0, 1, 1, data_dir=str(tmp_path))
    with pytest.raises(data_sources.DataUnavailable, match="is not a directory"):
        tasks.load_task("mbpp", 0, 1, 1, data_dir=str(tmp_path / "train.jsonl"))


@pytest.mark.parametrize("name, title", [("gsm8k", "GSM8K"), ("math", "MATH"), ("mbpp", "MBPP"),
                                         ("proofnet", "ProofNet")])
def test_an_unreachable_hub_fails_fast_with_directions(name, title, tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))           # an empty cache
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens
    start = time.monotonic()
    with pytest.raises(data_sources.DataUnavailable) as error:
        tasks.load_task(name, 0, 1, 1)
    assert time.monotonic() - start < 5
    message = str(error.value)
    assert message.startswith(f"{title} is not available") and "unreachable" in message
    assert f"hf download {tasks.BENCHMARKS[name].source.repo}" in message and "data_dir=DIR" in message
    # each flag the directions name is one of train.py's or eval.py's, for the task it loads
    assert "--data-dir DIR for --task, --eval-data-dir DIR for --eval-task; eval.py --data-dir DIR" in message
    assert {"data_dir", "eval_data_dir", "task", "eval_task"} <= set(Args.__dataclass_fields__)


def test_offline_mode_fails_at_once(tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(data_sources.DataUnavailable, match="HF_HUB_OFFLINE"):
        tasks.load_task("gsm8k", 0, 1, 1)
    assert time.monotonic() - start < 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_hub_probe_is_bounded_and_counts_any_http_answer():
    with socket.socket() as silent:             # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        assert not data_sources.hub_reachable(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=1.0)
        assert time.monotonic() - start < 2.0

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert data_sources.hub_reachable(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=2.0)
    finally:
        server.shutdown()


def test_a_malformed_json_line_names_its_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(GSM8K[0]) + "\n\n" + '{"question": "cut short\n')
    with pytest.raises(ValueError, match=r"train.jsonl, line 3: not a JSON row .*cut short"):
        data_sources._read_rows(path)
