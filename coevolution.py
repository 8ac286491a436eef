"""Threshold co-evolution and the fidelity predictor: proposal §2.3 and its challenge 4.

Thresholds. "A more aggressive sharing level" means raised (theta1, theta2) (DESIGN.md §4.1): more trajectories
reach the finer levels. Per source -> receiver pair and context, a ladder of levels L = 0, 1, ... gives
    theta(L) = (theta1_0 + L step, theta2_0 + L step),  theta2 <= 1.
The context is the pair and its capability gap, the source's mean training reward minus the receiver's, in
three buckets (source weaker, within `gap_band`, source stronger): a stronger source's trajectories carry more
phantom advantage, so the level that stays stable need not be the same. Each cycle an epsilon-greedy bandit
plays the context's current level (exploit) or, with probability epsilon, the next level up (explore), unless
that level's record of stable cycles is poor (below 1/2 after two tries). A stability guard judges each cycle
on three signals of the receiver, each compared with its own last `window` values (a value beyond mean + z std
of its history trips it): the update the cycle's admissions fed (its KL to the policy before it, measured
whatever the KL penalty, and its gradient norm), and the reward std of the rollouts that update produced. So
the verdict on cycle t waits for iteration t+1's rollouts (`updated`, then `judge`). A stable tried level is
kept; a trip backs the context off one level below what was played. Every pair into a receiver shares that
receiver's guard, so with epsilon small one pair rarely explores while another does; when both do, both are
credited with the outcome.

Where the thresholds start. Fixed thresholds, and the bandit's first level, are set by a stated rule on a
calibration seed that no comparison uses (`share_thresholds`, benchmarks/calibrate_thresholds.py): theta1 and
theta2 are the quantiles of the repaired degradation D_repaired of every diagnosed offer of a cross-fidelity run
that give each level a stated share of the offers, a third each by default, so that before the comparison no
level is favoured and where the curator sends a trajectory is the diagnosis's doing.

Predictor. A softmax regression in plain torch over cheap features (curator.py) predicts the admission band
(PRP, XGRPO, SGT) of a trajectory before its expensive diagnosis (the per-step gradient norms). It is refitted
each cycle on every fully diagnosed trajectory (a bounded buffer). A prediction is sure when its probability is
at least `confidence`; a sure prediction may skip the diagnosis only while the measured accuracy of the last
`trust_window` audited sure predictions is at least `trust` (so a drifting predictor stops skipping by itself),
and a share `audit` of sure predictions is always diagnosed in full to keep that accuracy measured. Trust is
per receiver, since one model serves every pair: a receiver's sure predictions are all diagnosed and audited
until `min_audits` of them have been, so none is skipped before the predictor was checked on that receiver.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from dataclasses import dataclass

import torch


def share_thresholds(d_repaired: list[float], shares: tuple[float, float] = (1 / 3, 1 / 3)) -> tuple[float, float]:
    """(theta1, theta2) that admit the given shares of the offers `d_repaired` to PRP and XGRPO (the rest to SGT):
    the shares[0] and shares[0] + shares[1] quantiles (linear interpolation between order statistics)."""
    values = torch.tensor([v for v in d_repaired if v == v], dtype=torch.float64)
    if len(values) < 2:
        raise ValueError(f"setting thresholds needs at least 2 diagnosed offers, got {len(values)}")
    if min(shares) < 0 or sum(shares) > 1:
        raise ValueError(f"shares are two non-negative fractions summing to at most 1, got {shares}")
    low, high = torch.quantile(values, torch.tensor([shares[0], shares[0] + shares[1]], dtype=torch.float64))
    return low.item(), high.item()


@dataclass(frozen=True)
class BanditConfig:
    step: float = 0.02
    """how far one level raises both thresholds"""
    epsilon: float = 0.2
    """probability of trying the next level up in a cycle"""
    gap_band: float = 0.1
    """capability gaps within +-gap_band count as 'similar'"""
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


class ThresholdBandit:
    """Per (pair, gap bucket) the current level, and per level the record of stable cycles."""

    def __init__(self, theta1: float, theta2: float, cfg: BanditConfig, seed: int):
        self.base, self.cfg = (theta1, theta2), cfg
        self.max_level = max(int((1.0 - theta2) / cfg.step + 1e-9), 0)
        self.level: dict[tuple, int] = defaultdict(int)
        self.record: dict[tuple, list[int]] = {}                                 # (context, level) -> [stable, tried]
        self.played: dict[tuple[str, str], tuple[tuple, int]] = {}
        self.pending: dict[str, tuple[list[tuple[tuple, int]], dict[str, float]]] = {}   # receiver -> cycle to judge
        self.guards: dict[str, StabilityGuard] = {}
        self.rng = random.Random(f"bandit/{seed}")

    def thresholds(self, level: int) -> tuple[float, float]:
        return self.base[0] + level * self.cfg.step, self.base[1] + level * self.cfg.step

    def choose(self, source: str, receiver: str, gap: float) -> tuple[float, float]:
        """The (theta1, theta2) the pair plays this cycle."""
        context = (source, receiver, gap_bucket(gap, self.cfg.gap_band))
        level = self.level[context]
        up = min(level + 1, self.max_level)
        stable, tried = self.record.get((context, up), (0, 0))
        if up > level and self.rng.random() < self.cfg.epsilon and (tried < 2 or stable >= tried / 2):
            level = up
        self.played[(source, receiver)] = (context, level)
        return self.thresholds(level)

    def updated(self, receiver: str, update: dict[str, float]) -> None:
        """After the receiver's update: the levels its pairs played this cycle and the update's statistics wait
        for the next rollouts (`judge`)."""
        played = [self.played.pop(pair) for pair in [p for p in self.played if p[1] == receiver]]
        self.pending[receiver] = (played, {s: update[s] for s in StabilityGuard.SIGNALS if s in update})

    def judge(self, receiver: str, reward_std: float) -> list[str] | None:
        """The guard's verdict on the receiver's last cycle, given the reward std of the rollouts its update
        produced: the signals that tripped (none: stable), which move the levels played; None if no cycle waits."""
        if receiver not in self.pending:
            return None
        played, update = self.pending.pop(receiver)
        guard = self.guards.setdefault(receiver, StabilityGuard(self.cfg.window, self.cfg.z))
        tripped = guard.check({**update, "charts/reward_std": reward_std})
        for context, level in played:
            record = self.record.setdefault((context, level), [0, 0])
            record[0] += not tripped
            record[1] += 1
            self.level[context] = max(level - 1, 0) if tripped else max(level, self.level[context])
        return tripped


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
        skips while the predictor is trusted on that receiver, unless drawn for audit; every sure one diagnosed in
        full is audited (`audited`), trusted or not, so that a predictor that lost its trust can win it back."""
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
