"""A run's curves reduced to numbers: the area under held-out accuracy (the primary metric's, in points) and the
training reward's variance free of its trend (eval.py's reward var.)."""

POINTS = 100.0                          # accuracy in [0, 1] -> points


def area_under(curve: list[tuple[int, float]], end: float) -> float:
    """Mean accuracy over x = 0..`end` of a curve of (x, accuracy) points from x = 0 (x an iteration or a cost
    spent): the trapezoid area up to `end`, the last segment cut there by linear interpolation, over `end`."""
    points = [(x, a) for x, a in curve if x <= end]
    later = [(x, a) for x, a in curve if x > end]
    if end <= 0 or not points or points[0][0] != 0 or (points[-1][0] < end and not later):
        raise ValueError(f"need evaluations from 0 to {end}, got {[x for x, _ in curve]}")
    if points[-1][0] < end:   # cut the segment that crosses `end`
        (x0, a0), (x1, a1) = points[-1], later[0]
        points.append((end, a0 + (a1 - a0) * (end - x0) / (x1 - x0)))
    area = sum((x1 - x0) * (a0 + a1) / 2 for (x0, a0), (x1, a1) in zip(points, points[1:]))
    return area / end


def reward_variance(means: list[float]) -> float:
    """Half the mean squared difference of consecutive values: the noise variance, insensitive to a trend."""
    if len(means) < 2:
        return float("nan")
    return sum((b - a) ** 2 for a, b in zip(means, means[1:])) / (2 * (len(means) - 1))
