"""``embedstream bench``: the workloads of benchmarks.md, their denominators, and the ratio table."""
