"""A deterministic all-pairs (pairwise) covering set: every value of every axis meets every value of every other
axis in at least one case, with far fewer cases than the full cartesian product.

Greedy construction: each new case starts from the first pair not yet covered and fills the remaining axes with
the value that covers the most new pairs (ties go to the earlier value, so list cheap values first).
"""

from __future__ import annotations

from itertools import combinations


def _pair(axis_a, value_a, axis_b, value_b):
    """The canonical key of a pair of (axis, value index) choices: the lower axis first."""
    return (axis_a, value_a, axis_b, value_b) if axis_a < axis_b else (axis_b, value_b, axis_a, value_a)


def all_pairs(axes: dict[str, list]) -> list[dict]:
    names = list(axes)
    sizes = [len(axes[name]) for name in names]
    uncovered = {
        (a, i, b, j) for a, b in combinations(range(len(names)), 2) for i in range(sizes[a]) for j in range(sizes[b])
    }
    cases = []
    while uncovered:
        a, i, b, j = min(uncovered)
        choice = {a: i, b: j}
        for axis in range(len(names)):
            if axis in choice:
                continue
            gains = [
                sum(_pair(axis, value, other, picked) in uncovered for other, picked in choice.items())
                for value in range(sizes[axis])
            ]
            choice[axis] = gains.index(max(gains))  # the first value among the best
        uncovered -= {(x, choice[x], y, choice[y]) for x, y in combinations(range(len(names)), 2)}
        cases.append({name: axes[name][choice[axis]] for axis, name in enumerate(names)})
    return cases
