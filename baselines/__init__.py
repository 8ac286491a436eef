"""The methods CROSS-FIDELITY is compared against that are not levels of Mutual RL, each a sharing.Share in a file of
its own: HACPO (hacpo.py) and GRAFT (graft.py), registered here as `--share hacpo` and `--share graft`. A new
baseline is its file, one line below and its test (tests/test_plugins.py shows one); the command line offers it by
its name, and its flags, if it has any, join args.py's."""

import sharing
from baselines import graft, hacpo

sharing.SHARES.update(hacpo=hacpo.SHARE, graft=graft.SHARE)
