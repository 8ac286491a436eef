"""The type checker in the test tier: mypy (pinned in requirements.txt, set up in mypy.ini) finds no error in the
loop (train.py), its teams (train.Team, train.LocalTeam, train_ray.RayTeam), the worker (learner.py) and the
curator with its receivers' side (curator.py, diagnosis.py). By hand: `python -m mypy`."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_error_in_the_loop_its_teams_the_worker_and_the_curator():
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
