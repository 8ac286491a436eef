"""train_ray.py against train.py: a run on Ray gives the local run's metrics, decisions and checkpointed weights
for the same seed (none, cross-fidelity with adaptive thresholds, the hidden TBD measure, whose source states cross
with the trajectories, with random admission); a train.py run resumed on three actors goes on as it would have
(PRP); an actor that raises hands its traceback to the loop; a killed actor ends the run within seconds, naming
its policy."""

import threading
import time
from dataclasses import asdict

import pytest
import ray
import torch

import train
import train_ray
from testbed import metrics_log
from test_train import records, tiny_args

pytestmark = pytest.mark.slow   # every test here trains end to end


@pytest.fixture(scope="module")
def local_ray():
    """One Ray for this file's runs, started here and shut down after them (a run leaves running a Ray it did not
    start): room for three actors at this process's torch threads each."""
    ray.init(num_cpus=3 * torch.get_num_threads(), include_dashboard=False)
    yield
    ray.shutdown()


def on_ray(tmp_path, cache_dir, gpus_per_policy: float | None = None, **settings) -> train_ray.RayArgs:
    """A run's settings on Ray, its actors computing at this process's thread count (as the local run does)."""
    return train_ray.RayArgs(**asdict(tiny_args(tmp_path, cache_dir, **settings)),
                             cpus_per_policy=torch.get_num_threads(), gpus_per_policy=gpus_per_policy)


def backend_free(run_dir) -> list[dict]:
    """Every metric line without what may differ between two runs of one seed: wall times and speeds."""
    return [metrics_log.timeless(r) for r in records(run_dir)]


def assert_same_weights(a, b, names: list[str], iteration: int) -> None:
    for name in names:
        saved = [torch.load(d / "checkpoints" / f"iter-{iteration:06d}" / f"{name}.pt")["model"] for d in (a, b)]
        for key in saved[0]:
            torch.testing.assert_close(saved[0][key], saved[1][key], rtol=0, atol=0)


@pytest.mark.parametrize("setting", [dict(share="none"), dict(share="cross-fidelity", thresholds="adaptive"),
                                     dict(share="cross-fidelity", tbd_measure="hidden", admission="random")],
                         ids=["none", "cross-fidelity", "hidden-tbd-random-admission"])
def test_a_run_on_ray_gives_the_local_runs_metrics_decisions_and_weights(tmp_path, cache_dir, local_ray, setting):
    local = train.main(tiny_args(tmp_path, cache_dir, name="local", **setting))
    remote = train_ray.main(on_ray(tmp_path, cache_dir, name="ray", **setting))
    assert backend_free(local) == backend_free(remote)
    assert_same_weights(local, remote, ["qwen", "llama"], 2)
    if setting["share"] == "cross-fidelity":
        decisions = [(d / "fidelity.jsonl").read_text() for d in (local, remote)]
        assert decisions[0] == decisions[1]
        assert len(decisions[0].splitlines()) == 2 * 2 * 8 * 6   # every peer rollout diagnosed by every receiver


def test_a_train_py_run_resumes_on_ray_as_it_would_have_gone_on_and_an_actor_that_raises_shows_its_traceback(
        tmp_path, cache_dir, local_ray):
    setting = dict(pair="trio", share="prp", iterations=3, checkpoint_every=2, eval_every=2)
    whole = train.main(tiny_args(tmp_path, cache_dir, name="local", **setting))
    train.main(tiny_args(tmp_path, cache_dir, name="moved", **{**setting, "iterations": 2}))

    part = tmp_path / "moved" / "checkpoints" / "iter-000002" / "llama.pt"
    saved = part.read_bytes()
    torch.save({"model": {"not.a.weight": torch.zeros(1)}, "optimizer": {}}, part)
    with pytest.raises(ValueError, match="does not match the model") as raised:
        train_ray.main(on_ray(tmp_path, cache_dir, name="moved", resume=True, **setting))
    assert "PolicyActor(llama)" in str(raised.value) and "checkpoint.py" in str(raised.value)  # from the actor
    part.write_bytes(saved)

    resumed = train_ray.main(on_ray(tmp_path, cache_dir, name="moved", resume=True, **setting))
    assert backend_free(whole) == backend_free(resumed)
    assert_same_weights(whole, resumed, ["qwen", "llama", "mistral"], 3)


def test_a_killed_actor_ends_the_run_within_seconds_naming_its_policy(tmp_path, cache_dir, local_ray, monkeypatch):
    teams, killed = [], []
    start = train_ray.RayTeam.start

    def started(team, *args):
        start(team, *args)
        teams.append(team)
    monkeypatch.setattr(train_ray.RayTeam, "start", started)

    def kill_llama_once_an_iteration_is_logged():
        metrics = tmp_path / "run" / "metrics.jsonl"
        while not metrics.exists() or metrics.read_text().count("losses/policy_loss") < 2:
            time.sleep(0.05)
        killed.append(time.perf_counter())      # before the kill: the run may end before this thread runs again
        ray.kill(teams[0].actors[1])
    threading.Thread(target=kill_llama_once_an_iteration_is_logged, daemon=True).start()
    with pytest.raises(train_ray.PolicyLost, match="llama's Ray actor died"):
        train_ray.main(on_ray(tmp_path, cache_dir, iterations=100, eval_every=100, checkpoint_every=100))
    assert time.perf_counter() - killed[0] < 10


def test_a_cluster_without_room_for_every_actor_is_refused_at_start(tmp_path, cache_dir, local_ray):
    assert train_ray.actors_that_fit([{"CPU": 4.0, "GPU": 1.0}, {"CPU": 2.0}], 1, 1) == 1
    assert train_ray.actors_that_fit([{"CPU": 4.0, "GPU": 1.0}, {"CPU": 2.0}], 2, 0) == 3
    assert train_ray.actors_that_fit([{"CPU": 4.0, "GPU": 1.0}], 1, 0.5) == 2
    with pytest.raises(ValueError, match="room for 0 of the 2"):
        train_ray.RayTeam(on_ray(tmp_path, cache_dir, gpus_per_policy=1.0))
    with pytest.raises(ValueError, match="--gpus-per-policy"):
        on_ray(tmp_path, cache_dir, devices="cpu")


def test_a_pair_with_no_preset_at_the_clusters_scale_is_refused_before_the_run_writes_anything(tmp_path, cache_dir,
                                                                                               local_ray, monkeypatch):
    # a cluster with GPUs runs the small scale by default, which has no qwen-mistral
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}}])
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(ValueError, match="unknown pair 'qwen-mistral' at scale small"):
        train_ray.main(on_ray(runs, cache_dir, pair="qwen-mistral"))
    assert list(runs.iterdir()) == []
