"""The sandbox that runs generated code for the code tasks' rewards: sandbox.py starts each program under bwrap
with the system-call filter of syscall_filter.py and the memory cgroup of memory_cgroup.py; inside_sandbox.py is
what runs in there (DESIGN.md §7)."""
