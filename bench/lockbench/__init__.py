"""lockext's benchmarks, side by side in one run: `bash bench/run.sh` (or `python3
bench/bench.py`, or `python3 -m lockbench` from bench/). bench/README.md says what each
module owns; they import one way, in this order: shell, config, systems, workloads,
cluster, runner, fills, scale, report, charts, cli.
"""
