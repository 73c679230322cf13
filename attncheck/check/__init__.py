"""The dump-only checker: every attention site recomputed from other printed numbers, under facts pinned per run
(dumponly.py). verify drives it; the command line and inspect reach into it, nothing else."""
