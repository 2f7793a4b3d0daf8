"""``embedstream bench``: the workloads of docs/benchmarks.md, their denominators, and the ratio table."""
