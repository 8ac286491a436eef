import os

import pytest
import torch

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
    return {f: (tiny.full_tokenizer(f), token_bytes.token_bytes_table(tiny.full_tokenizer(f)))
            for f in ("qwen2", "llama", "mistral")}


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
