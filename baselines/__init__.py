"""The methods CROSS-FIDELITY is compared against that are not levels of Mutual RL: HACPO (hacpo.py) and GRAFT
(graft.py); sharing.py runs them as `--share hacpo` and `--share graft`."""
