"""What results/preregistration-premise.md fixes (issue 52), in one place: every entry point of
benchmarks/premise.py reads its defaults here, so that a run at the defaults is the registered one."""

from dataclasses import dataclass

from analysis import sets

RUN_FLAGS = (*sets.CURATED, *sets.PROTOCOL)
"""train.py flags of every run: cross-fidelity with the exact CCM estimate under the matrix's protocol"""

GATE_SEED, GATE_PRESET, GATE_ITERATION, GATE_OFFERS = 3001, "qwen-llama", 50, 200
"""the validation gate: seed 3001, qwen-llama, 200 offers at iteration 50"""
HELDOUT_PROMPTS, HELDOUT_SAMPLES = 128, 16
"""g_J: 128 held-out prompts x 16 samples per half, two independent halves"""
LOOKAHEAD_PROMPTS, LOOKAHEAD_SAMPLES = 256, 16
"""the lookahead's held-out reward: 256 prompts x 16 samples, common random numbers before and after"""


@dataclass(frozen=True)
class Sizes:
    """How many held-out prompts and samples g_J and the lookahead take: the registered counts by default (a smoke
    run takes fewer)."""

    heldout_prompts: int = HELDOUT_PROMPTS
    heldout_samples: int = HELDOUT_SAMPLES
    lookahead_prompts: int = LOOKAHEAD_PROMPTS
    lookahead_samples: int = LOOKAHEAD_SAMPLES


LR_LADDER = (0.01, 0.03, 0.1, 0.3)
LR_OFFERS, LR_STANDARD_ERRORS = 50, 3.0
"""the lookahead's step: the smallest rung at which the top-decile update of the first 50 offers moves held-out
reward by at least 3 standard errors of its paired difference"""
RELIABILITY, MAX_DOUBLINGS = 0.5, 4
"""the split-half Spearman rho of U's halves must reach 0.5; else the held-out samples double, up to 4 times"""

PRESETS = {"qwen-llama": ("--pair", "qwen-llama"), "qwen-qwen": ("--pair", "qwen-qwen"),
           "trio-prose": ("--pair", "trio", "--step-format", "prose")}
"""the sample's presets (line steps for the pairs, prose for the trio): ten directions"""
SEEDS = (3002, 3003, 3004)
STAGES = (10, 50, 90)
OFFERS_PER_DIRECTION = 40
"""per direction, seed and stage, up to 40 offers drawn among the diagnosed ones with A != 0"""

LEVEL = 0.95
ALPHA = 0.05
TRIVIAL_RHO = -0.1
"""95% intervals; Holm at a family-wise 0.05; refuted where the interval lies above -0.1"""
TERM_PRESENCE = 0.1
"""P2 takes a term in a direction where it is non-zero on at least 10% of the direction's offers"""
TERMS = ("tbd", "ccm", "rsd")
SIGNALS = ("prp_ratio", "hacpo_s", "graft_weight", "ftis_kl", "reward", "advantage")
"""the terms of D (P2) and the baselines' admission signals beside them (P4)"""
