"""How one model call's texts are cut into forward passes.

Texts are sorted by length and cut into consecutive slices; each slice is one forward pass, padded
to its longest text. Every pass holds at most ``max_texts`` texts and costs at most ``max_tokens``
padded tokens (count × longest); a text alone over that budget still gets a pass of its own. Within
those bounds two cuts are on offer:

- :func:`split_by_cost` (CPUs): the cut with the least cost, a pass costing its padded tokens plus a
  fixed ``pass_tokens`` (what one more pass costs, in tokens). Measured here (2 cores, best of five
  passes at each shape, MiniLM): a pass takes ~2.5 ms + 36 µs a padded token at bf16 (one more pass
  ≈ 64 tokens), ~4 ms + 117 µs at fp32 (≈ 32), ~2.5 ms + 20 µs at OpenVINO int8 (≈ 128) — but
  OpenVINO also pays ~12 ms on the first pass of each new shape, and more passes make more shapes:
  int8 counts 256 (against 128: ~3 % more padded tokens, a quarter fewer passes; in-process, a
  fresh embedder ran as fast as with the greedy cut, one that had seen the shapes 3-10 % faster).
  On the bench's 3,164 S2 chunks in calls of 630: 77 passes and 194,865 padded tokens against the
  greedy cut's 68 and 203,674 (−4.3 %); in calls of 315 (two models sharing a group) 109 and
  199,698 against 97 and 209,507.
- :func:`split_by_budget` (CUDA, where it was measured): greedy, a pass closing when the next text
  would break a bound or bring real ÷ padded tokens under ``min_fill``.
"""

from __future__ import annotations

import numpy as np

#: One more forward pass, in padded tokens of the same pass (see the module doc), by precision.
PASS_TOKENS = {"int8": 256, "bf16": 64, "fp16": 32, "fp32": 32}


def _by_length(lengths: list[int]) -> list[int]:
    """Indices of ``lengths``, shortest first (both cuts cut this order)."""
    return sorted(range(len(lengths)), key=lengths.__getitem__)


def split_by_cost(lengths: list[int], max_texts: int, max_tokens: int, pass_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length, cut into passes that minimise padded tokens plus
    ``pass_tokens`` a pass (dynamic programming over the sorted lengths: ~5 µs a text)."""
    order = _by_length(lengths)
    n = len(order)
    sorted_lengths = [lengths[i] for i in order]
    positions = np.arange(n + 1)
    best = np.zeros(n + 1)  # best[j]: the least cost of the j shortest texts
    first = np.zeros(n + 1, dtype=np.int64)  # first[j]: where the last pass of that cut starts
    for j in range(1, n + 1):
        longest = sorted_lengths[j - 1]
        lo = j - max(1, min(max_texts, j, max_tokens // max(longest, 1)))
        cost = best[lo:j] + (j - positions[lo:j]) * longest
        i = int(cost.argmin())  # ties: the earliest start, the fewest passes
        best[j] = cost[i] + pass_tokens
        first[j] = lo + i
    passes: list[list[int]] = []
    while n:
        start = int(first[n])
        passes.append(order[start:n])
        n = start
    passes.reverse()
    return passes


def split_by_budget(lengths: list[int], max_texts: int, max_tokens: int, min_fill: float = 0.8) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length, cut greedily: a pass closes when adding the next text
    would break a bound or bring real ÷ padded tokens under ``min_fill`` (so one long text does not
    pad many short ones)."""
    order = _by_length(lengths)
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        longest = lengths[i]  # sorted ascending: the newcomer is the longest
        n = len(current) + 1
        if current and (n > max_texts or n * longest > max_tokens or (real + longest) < min_fill * n * longest):
            groups.append(current)
            current, real = [], 0
        current.append(i)
        real += longest
    if current:
        groups.append(current)
    return groups
