"""The apply benchmark's parts (bench/apply_bench.py is the entry point).

common     - the bench context, SQL helpers, per-process CPU and peak RSS
workloads  - the eight workloads: schema, preload, the source-side run, checks
consumers  - pg_recvlogical, the built-in subscription, pglogical 2, applier run
steady     - the live fixed-rate workload (lag p50/p99 per consumer)
report     - medians, markdown tables, the JSON dump
"""
