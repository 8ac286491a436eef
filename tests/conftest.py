import os
import resource
import site
import subprocess

import pytest
import torch

from sandbox_world import LIMITS, PLANTED, no_sandbox_process_left, snapshot
from testbed import tasks

FAMILIES = ("qwen2", "llama", "mistral")    # the tokenizer families the project packages

# a seeded test holds at 1 and at 2 threads (TEST_THREADS chooses); under pytest-xdist's workers (-n auto, a worker a
# core) each takes one, so that the workers do not contend for the cores
torch.set_num_threads(int(os.environ.get("TEST_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a long end-to-end run (real weights, Ray, full training, a benchmark "
                                       "command); the README's second tier, "
                                       "`python -m pytest -q -m slow -n auto --dist loadfile tests`")


@pytest.fixture(scope="session")
def real():
    """family -> (its full packaged tokenizer, that tokenizer's token bytes)"""
    from testbed import tiny
    from testbed import token_bytes
    return {f: (tiny.full_tokenizer(f), token_bytes.token_bytes_table(tiny.full_tokenizer(f))) for f in FAMILIES}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """One warm-up cache for the whole session, so tiny policies are warmed up once."""
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def scripted_rewards(monkeypatch):
    """`scripted_rewards(rewards)`: every policy's rollouts of a run get the [B, G] rewards `rewards(policy,
    problems)` gives, whatever was sampled, so that what the rewards decide does not hang on where sampling lands."""
    import learner
    from testbed import tasks
    experience = learner.experience

    def script(rewards):
        def scripted_experience(one, args, task, problems, *rest):
            with monkeypatch.context() as m:
                m.setattr(tasks, "group_rewards", lambda *_: rewards(one.policy, problems))
                return experience(one, args, task, problems, *rest)
        monkeypatch.setattr(learner, "experience", scripted_experience)
    return script


@pytest.fixture(scope="module")
def has_close_elements():
    return next(e for e in tasks.load_task("humaneval", 0, 1000, 1000).train + tasks.load_task(
        "humaneval", 0, 1000, 1000).heldout if e.id == "HumanEval/0")


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
