"""``embedstream bench``: the workloads of the README's Benchmark section, their denominators, and the ratio table."""
