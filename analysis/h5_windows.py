"""H5's path (results/preregistration-matrix.md, H5): a policy's iterations cut into windows, each read as a point
of the stability-support plane. benchmarks/h5_path.py writes the per-iteration records the points are read from."""

from analysis.curves import reward_variance

WINDOWS = 4
"""the registration's windows: 100 iterations in 4 of 25"""


def window_points(received: list[float], rewards: list[float], windows: int = WINDOWS) -> list[tuple[float, float]]:
    """(mean received per iteration, reward variance) within each of `windows` equal consecutive windows of a
    policy's iterations."""
    if len(received) != len(rewards) or len(rewards) % windows or len(rewards) // windows < 2:
        raise ValueError(f"{len(received)} received and {len(rewards)} rewards do not fall in {windows} equal "
                         f"windows of at least 2 iterations")
    size = len(rewards) // windows
    cut = [slice(w * size, (w + 1) * size) for w in range(windows)]
    return [(sum(received[c]) / size, reward_variance(rewards[c])) for c in cut]
