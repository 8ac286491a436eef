"""The registered sets of runs: each set's configurations (their train.py flags), seeds, shared flags and length,
as the pre-registrations fix them. benchmarks/matrix.py runs them; the analysis reads which runs a registration
holds from here.
"""

from __future__ import annotations

from dataclasses import dataclass

EVALUATION = ["--eval-size", "2000", "--eval-every", "10", "--eval-samples", "0"]
"""the evaluation protocol of the testbed's power runs (benchmarks/power.py) and of the comparison sets (PROTOCOL):
greedy pass@1 on 2,000 held-out problems every 10 iterations"""


@dataclass(frozen=True)
class MatrixSet:
    configurations: dict[str, tuple[str, ...]]
    """configuration name -> its train.py flags"""
    seeds: tuple[int, ...]
    shared: tuple[str, ...]
    """train.py flags of every configuration: the evaluation protocol and the minibatch schedule"""
    iterations: int = 100
    """every run trains to this iteration"""


PILOT_CONFIGURATIONS = {
    "none": ("--share", "none"),
    "none-g16": ("--share", "none", "--group-size", "16"),
    "prp": ("--share", "prp"),
    "xgrpo": ("--share", "xgrpo"),
    "sgt": ("--share", "sgt"),
    "hacpo": ("--share", "hacpo"),
    "graft": ("--share", "graft"),
    "cross-fidelity": ("--share", "cross-fidelity", "--ccm-estimate", "exact"),
    "cross-fidelity-random": ("--share", "cross-fidelity", "--ccm-estimate", "exact", "--admission", "random"),
}
"""the pilot's configurations, each naming its share and CCM estimate (the pilot ran them at train.py's defaults
of 0ff2d38, none and exact: the same runs)"""
CURATED = PILOT_CONFIGURATIONS["cross-fidelity"]
MATRIX_CONFIGURATIONS = {
    **PILOT_CONFIGURATIONS,
    "cross-fidelity-last2": ("--share", "cross-fidelity", "--ccm-estimate", "last:2"),
    "cross-fidelity-ablate-ccm": (*CURATED, "--ablate", "ccm"),
    "cross-fidelity-ablate-rsd": (*CURATED, "--ablate", "rsd"),
    "cross-fidelity-adaptive": (*CURATED, "--thresholds", "adaptive"),
    "cross-fidelity-intrinsic": (*CURATED, "--process-signal", "intrinsic"),
    "cross-fidelity-hidden": (*CURATED, "--tbd-measure", "hidden"),
}
"""the matrix's configurations on qwen-llama (results/preregistration-matrix.md)"""
DESCRIPTIVE = {"cross-fidelity": CURATED, "cross-fidelity-hidden": MATRIX_CONFIGURATIONS["cross-fidelity-hidden"]}
"""H4's runs on the other pairs and step formats: where each degradation dominates, by two TBD measures (one on
the trio, whose runs cost the most)"""
PROTOCOL = (*EVALUATION, "--minibatches", "2")
"""the pilot's evaluation protocol and minibatch schedule, shared by every comparison set"""
H3_CONFIGURATIONS = {"none": ("--share", "none"), "sgt": ("--share", "sgt"),
                     "hacpo": ("--share", "hacpo", "--hacpo-variant", "ours"), "cross-fidelity": CURATED}
H3_SEEDS = tuple(range(6001, 6009))
H3_GROUPINGS = ("trio", "qwen-llama", "qwen-mistral", "llama-mistral")
"""H3's configurations, its seeds and the trio's groupings it runs them in, the trio first so that its warm-ups
serve the pairs (results/preregistration-h3.md)"""
CCM_ESTIMATE_CONFIGURATIONS = {
    "cross-fidelity-last0": ("--share", "cross-fidelity", "--ccm-estimate", "last:0"),
    "cross-fidelity-last2": MATRIX_CONFIGURATIONS["cross-fidelity-last2"],
}
"""CCM's norms over the head and final norm alone against the default last:2
(results/preregistration-ccm-estimate.md)"""
SETS = {
    "pilot": MatrixSet(PILOT_CONFIGURATIONS, tuple(range(1001, 1009)), PROTOCOL),
    "matrix": MatrixSet(MATRIX_CONFIGURATIONS, tuple(range(1009, 1031)), PROTOCOL),
    "matrix-trio-prose": MatrixSet({"cross-fidelity": CURATED,
                                    "cross-fidelity-ablate-tbd": (*CURATED, "--ablate", "tbd")},
                                   (1009, 1010, 1011), (*PROTOCOL, "--pair", "trio", "--step-format", "prose")),
    "matrix-h4-trio-line": MatrixSet({"cross-fidelity": CURATED}, (1009, 1010), (*PROTOCOL, "--pair", "trio")),
    **{f"matrix-h4-{pair}-{form}": MatrixSet(DESCRIPTIVE, (1009, 1010),
                                             (*PROTOCOL, "--pair", pair, "--step-format", form))
       for pair, form in (("qwen-qwen", "line"), ("qwen-qwen", "prose"), ("qwen-llama", "prose"))},
    "hacpo-official": MatrixSet({"hacpo-official": ("--share", "hacpo", "--hacpo-variant", "official"),
                                 "hacpo": ("--share", "hacpo", "--hacpo-variant", "ours"),
                                 "sgt": ("--share", "sgt")}, tuple(range(7001, 7028)), PROTOCOL),
    **{f"h3-{grouping}": MatrixSet(H3_CONFIGURATIONS, H3_SEEDS, (*PROTOCOL, "--pair", grouping))
       for grouping in H3_GROUPINGS},
    "smoke": MatrixSet({name: PILOT_CONFIGURATIONS[name] for name in ("none", "hacpo", "graft")}, (1, 2),
                       ("--eval-size", "16", "--eval-every", "1", "--eval-samples", "0", "--minibatches", "2",
                        "--prompts-per-iteration", "4", "--group-size", "4", "--max-new-tokens", "16",
                        "--warmup-scale", "0.05", "--train-size", "100"), iterations=2),
    "ccm-estimate": MatrixSet(CCM_ESTIMATE_CONFIGURATIONS, tuple(range(2301, 2312)), PROTOCOL),
    "speed-check": MatrixSet({"none": ("--share", "none")}, (700, 900, 901), (*EVALUATION, "--minibatches", "2")),
}
"""the named sets: the pre-registered pilot (results/preregistration.md); the matrix's, each run as its
registration's blocks say (results/preregistration-matrix.md); HACPO as its authors wrote it against today's
(results/preregistration-hacpo-official.md); the cheaper CCM estimate against the default
(results/preregistration-ccm-estimate.md); the check of a change that alters metrics, the
pilot's protocol on three seeds no comparison uses, run at the commits before and after it
(benchmarks/speed_check.py); and a smoke test of the runner"""
