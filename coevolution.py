"""Threshold co-evolution and the fidelity predictor: proposal §2.3 and its challenge 4.

Thresholds. "A more aggressive sharing level" means raised (theta1, theta2) (DESIGN.md §4.1): more trajectories
reach the finer levels. Per source -> receiver pair and context, a ladder of levels L = 0, 1, ..., 1/step gives
    theta(L) = (theta1_0 + L step, theta2_0 + L step),
raised from the iteration's level-0 thresholds (the receiver's calibration sample's, term_scales.py, or the fixed
ones given); at L = 1/step every D, which is at most 1, is below both. The context is the pair and its capability
gap (the source's mean training reward minus the receiver's, in three buckets): a stronger source's trajectories
carry more phantom advantage, so the level that pays need not be the same. Each cycle an epsilon-greedy bandit plays
the context's level, or with probability epsilon a neighbour (up or down, half each). A level earns its place by a
measured gain: the receiver's mean reward on the rollouts the cycle's update produced, minus what its own recent
trend predicts (a line through its last `trend_window` rewards), so training progress that would have come anyway is
not credited to the thresholds. While a context stays at one level, the cycles it plays there and at its neighbours
are a randomized comparison against one trend; their gains are its evidence, cleared when the level moves. The
context moves up when the level above has gained more than the current one by `gain_z` standard errors, and down as
soon as the level below has gained as much as the current one: a raise is undone when its gain goes. A guard still
judges each cycle on three signals of the receiver (its update's KL to the policy before it, its gradient norm, and
its rollouts' reward std, each against mean + z std of its own last `window` values); a trip backs the context off
one level below what was played. The verdict on cycle t waits for iteration t+1's rollouts (`updated`, then
`judge`). Every pair into a receiver shares its gains and its guard.

Predictor. A softmax regression in plain torch over cheap features (curator.py) predicts the admission band (PRP,
XGRPO, SGT) of a trajectory before its expensive diagnosis (the per-step gradient norms). It is refitted each cycle
on every fully diagnosed trajectory (a bounded buffer). A prediction is sure when its probability is at least
`confidence`; a sure prediction may skip the diagnosis only while the measured accuracy of the last `trust_window`
audited sure predictions is at least `trust` (so a drifting predictor stops skipping by itself), and a share `audit`
of sure predictions is always diagnosed in full to keep that accuracy measured. Only the sure predictions that could
skip are audited (one whose tokens would cross is diagnosed whatever it predicts, and its accuracy would vouch for
the others). Trust is per receiver, since one model serves every pair: a receiver's sure predictions are all
diagnosed and audited until `min_audits` of them have been, so none is skipped before the predictor was checked on
that receiver.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BanditConfig:
    step: float = 0.02
    """how far one level raises both thresholds"""
    epsilon: float = 0.3
    """probability of playing a neighbouring level in a cycle (up or down, half each)"""
    gap_band: float = 0.1
    """capability gaps within +-gap_band count as 'similar'"""
    trend_window: int = 10
    """the receiver's recent rewards whose line predicts the next one; the gain is what exceeds it"""
    evidence: int = 20
    """gains kept per level of a context's current comparison: older cycles are forgotten"""
    gain_z: float = 2.0
    """a level is raised when the one above gained more by this many standard errors"""
    window: int = 10
    """stability guard: cycles of each signal's own history it is compared with"""
    z: float = 3.0
    """stability guard: trips beyond mean + z std of the history"""


def gap_bucket(gap: float, band: float) -> str:
    return "weaker" if gap < -band else "stronger" if gap > band else "similar"


class StabilityGuard:
    """One receiver's recent reward std, update KL and gradient norm; `check` says whether a cycle stayed in range."""

    SIGNALS = ("charts/reward_std", "losses/update_kl", "losses/grad_norm")

    def __init__(self, window: int, z: float):
        self.history = {s: deque(maxlen=window) for s in self.SIGNALS}
        self.z = z

    def check(self, stats: dict[str, float]) -> list[str]:
        """The signals that left their range this cycle (none: stable); then the cycle joins the history."""
        missing = [s for s in self.SIGNALS if s not in stats]
        if missing:
            raise ValueError(f"the stability guard judges a cycle on {self.SIGNALS}; {missing} were not measured")
        tripped = []
        for signal, past in self.history.items():
            value = stats[signal]
            if len(past) >= 3:
                values = torch.tensor(list(past), dtype=torch.float64)
                spread = max(values.std().item(), 1e-3 * abs(values.mean().item()), 1e-8)
                if not value <= values.mean().item() + self.z * spread:   # NaN trips too
                    tripped.append(signal)
            past.append(value)
        return tripped


def trend_gain(history: list[float], value: float) -> float | None:
    """value minus the least-squares line through `history` extrapolated one step; None with under 3 points."""
    if len(history) < 3:
        return None
    y = torch.tensor(history, dtype=torch.float64)
    x = torch.arange(len(y), dtype=torch.float64) - (len(y) - 1) / 2
    slope = (x * (y - y.mean())).sum() / (x * x).sum()
    return value - (y.mean() + slope * (len(y) - 1) / 2 + slope).item()


def mean_and_se(values) -> tuple[float, float]:
    v = torch.tensor(list(values), dtype=torch.float64)
    return v.mean().item(), (v.std() / math.sqrt(len(v))).item() if len(v) > 1 else math.inf


class ThresholdBandit:
    """Per (pair, gap bucket) the current level, and per (context, level) the gains of its recent cycles."""

    def __init__(self, cfg: BanditConfig, seed: int):
        self.cfg = cfg
        self.max_level = int(1.0 / cfg.step + 1e-9)
        self.level: dict[tuple, int] = defaultdict(int)
        self.gains: dict[tuple, dict[int, deque[float]]] = defaultdict(dict)     # context -> level -> its gains
        self.played: dict[tuple[str, str], tuple[tuple, int]] = {}
        self.pending: dict[str, tuple[list[tuple[tuple, int]], dict[str, float]]] = {}   # receiver -> cycle to judge
        self.rewards: dict[str, deque[float]] = {}                               # receiver -> recent mean rewards
        self.guards: dict[str, StabilityGuard] = {}
        self.rng = random.Random(f"bandit/{seed}")

    def choose(self, source: str, receiver: str, gap: float) -> int:
        """The level the pair plays this cycle: its thresholds are raised by level x step."""
        context = (source, receiver, gap_bucket(gap, self.cfg.gap_band))
        level = self.level[context]
        if self.rng.random() < self.cfg.epsilon:
            level = min(max(level + self.rng.choice((-1, 1)), 0), self.max_level)
        self.played[(source, receiver)] = (context, level)
        return level

    def updated(self, receiver: str, update: dict[str, float]) -> None:
        """After the receiver's update: the levels its pairs played this cycle and the update's statistics wait
        for the next rollouts (`judge`)."""
        played = [self.played.pop(pair) for pair in [p for p in self.played if p[1] == receiver]]
        self.pending[receiver] = (played, {s: update[s] for s in StabilityGuard.SIGNALS if s in update})

    def judge(self, receiver: str, rewards: dict[str, float]) -> list[str] | None:
        """The verdict on the receiver's last cycle, given the rollouts its update produced (rewards:
        charts/reward_mean and charts/reward_std): the guard's tripped signals (none: stable). The cycle's gain
        joins its levels' evidence, and each context it played moves by the module docstring's rule. None if no
        cycle waits."""
        history = self.rewards.setdefault(receiver, deque(maxlen=self.cfg.trend_window))
        gain = trend_gain(list(history), rewards["charts/reward_mean"])
        history.append(rewards["charts/reward_mean"])
        if receiver not in self.pending:
            return None
        played, update = self.pending.pop(receiver)
        guard = self.guards.setdefault(receiver, StabilityGuard(self.cfg.window, self.cfg.z))
        tripped = guard.check({**update, "charts/reward_std": rewards["charts/reward_std"]})
        for context, level in played:
            if gain is not None:
                self.gains[context].setdefault(level, deque(maxlen=self.cfg.evidence)).append(gain)
            new = max(level - 1, 0) if tripped else self.moved(context)
            if new != self.level[context]:
                self.level[context], self.gains[context] = new, {}
        return tripped

    def moved(self, context: tuple) -> int:
        """The context's level after its evidence: one up if the level above gained more by gain_z standard
        errors (at least 3 cycles each), one down if the level below gained at least as much as the current one."""
        level = self.level[context]

        def evidence(at: int) -> tuple[float, float] | None:
            gains = self.gains[context].get(at, ())
            return mean_and_se(gains) if len(gains) >= 3 else None
        here, above, below = evidence(level), evidence(level + 1), evidence(level - 1)
        if level > 0 and here and below and here[0] <= below[0]:
            return level - 1
        if (level < self.max_level and here and above
                and above[0] - here[0] > self.cfg.gain_z * math.hypot(here[1], above[1])):
            return level + 1
        return level


@dataclass(frozen=True)
class PredictorConfig:
    confidence: float = 0.9
    """a prediction at least this probable is sure"""
    audit: float = 0.2
    """share of sure predictions diagnosed in full anyway"""
    trust: float = 0.95
    """sure predictions skip only while this share of the recently audited ones was right"""
    trust_window: int = 50
    """audited sure predictions the trust is measured over"""
    min_history: int = 64
    """fully diagnosed trajectories before the predictor may skip"""
    min_audits: int = 20
    """audited sure predictions of a receiver before the predictor may skip any of that receiver's"""
    capacity: int = 4096
    """trajectories kept to refit on"""
    l2: float = 1e-3
    """ridge penalty of the softmax regression"""


class FidelityPredictor:
    """Softmax regression of the admission band on standardized cheap features."""

    def __init__(self, n_features: int, cfg: PredictorConfig, seed: int, classes: int = 3):
        self.cfg = cfg
        self.weight = torch.zeros(n_features + 1, classes, dtype=torch.float64)     # [F+1, C], last row: bias
        self.x: deque[torch.Tensor] = deque(maxlen=cfg.capacity)
        self.y: deque[int] = deque(maxlen=cfg.capacity)
        self.audits: dict[str, deque[bool]] = {}                                     # per receiver
        self.rng = random.Random(f"predictor/{seed}")
        self.mean = torch.zeros(n_features, dtype=torch.float64)
        self.std = torch.ones(n_features, dtype=torch.float64)

    def _design(self, x: torch.Tensor) -> torch.Tensor:
        """[N, F] -> [N, F+1] standardized, with a constant column."""
        z = (x.double() - self.mean) / self.std
        return torch.cat([z, torch.ones(len(z), 1, dtype=torch.float64)], dim=1)

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, F] -> predicted band [N] and its probability [N]."""
        probs = torch.softmax(self._design(x) @ self.weight, dim=1)                # [N, C]
        prob, band = probs.max(dim=1)
        return band, prob

    def trusted(self, receiver: str) -> bool:
        """The receiver's sure predictions may skip: enough history, and at least `min_audits` of its sure
        predictions audited, right often enough."""
        audits = self.audits.get(receiver, ())
        return (len(self.y) >= self.cfg.min_history and len(audits) >= self.cfg.min_audits
                and sum(audits) >= self.cfg.trust * len(audits))

    def may_skip(self, receiver: str, prob: float) -> tuple[bool, bool]:
        """(sure, skip) for a prediction of probability `prob` about a trajectory offered to `receiver`. A sure one
        skips while the predictor is trusted on that receiver, unless drawn for audit; every sure one that could
        have skipped and was diagnosed in full is audited (`audited`), trusted or not, so that a predictor that
        lost its trust can win it back."""
        sure = len(self.y) >= self.cfg.min_history and prob >= self.cfg.confidence
        return sure, sure and self.trusted(receiver) and self.rng.random() >= self.cfg.audit

    def audited(self, receiver: str, correct: bool) -> None:
        self.audits.setdefault(receiver, deque(maxlen=self.cfg.trust_window)).append(correct)

    def learn(self, x: torch.Tensor, y: torch.Tensor, steps: int = 100) -> None:
        """Add fully diagnosed trajectories (x [N, F], band y [N]) and refit on the buffer, warm-started."""
        if len(x) == 0:
            return
        if not torch.isfinite(x).all():
            raise ValueError("predictor features contain NaN or inf")
        self.x.extend(x.double())
        self.y.extend(y.tolist())
        xs, ys = torch.stack(list(self.x)), torch.tensor(list(self.y))
        std = xs.std(0, unbiased=False)
        # a feature constant so far (a pair not yet seen) stays unscaled, so its first new value is not blown up
        self.mean, self.std = xs.mean(0), torch.where(std > 1e-6, std, torch.ones_like(std))
        design = self._design(xs)                                                   # [M, F+1]
        weight = self.weight.clone().requires_grad_(True)
        optimizer = torch.optim.LBFGS([weight], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(design @ weight, ys) + self.cfg.l2 * weight[:-1].pow(2).sum()
            loss.backward()
            return loss
        optimizer.step(closure)
        self.weight = weight.detach()

    def accuracy(self, receiver: str) -> float:
        """Measured accuracy of the receiver's recently audited sure predictions (NaN before the first audit)."""
        audits = self.audits.get(receiver, ())
        return sum(audits) / len(audits) if audits else float("nan")
