"""The scripts behind the figures the pages report, each run from the repository's root as `python -m
benchmarks.NAME` (its page names its command): timings, costs and checks of the code, the testbed's power, the
comparison's runner (`matrix.py`), the premise's measurement (`premise*.py`; its analysis is in analysis/) and paired
branches from one checkpoint (`branches.py`). A script may import any module of the project; no module outside this
folder imports a script."""
