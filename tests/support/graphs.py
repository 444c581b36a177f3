"""Capturing a step in a CUDA graph the way serving code does."""

from __future__ import annotations

import torch

from tests.support.launch_paths import launches_during


def capture(step):
    """Warms `step` up on a side stream (lazy initialisation stays out of the graph), then captures it.
    Returns (graph, what the captured call returned: the tensors each replay rewrites, the launches per path made
    while capturing)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()

    def record():
        with torch.cuda.graph(graph):
            return step()

    results, launched = launches_during(record)
    return graph, results, launched
