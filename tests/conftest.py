import os

import numpy as np
import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two xdist workers on a 2-core machine: one torch thread each, so they do not oversubscribe the cores
    torch.set_num_threads(1)

from specrepro.tiny import tiny_pair


@pytest.fixture(scope="session")
def pair64():
    """Tiny float64 target (Llama) and draft (GPT-2), vocabulary 8."""
    return tiny_pair(8, seed=0, dtype=torch.float64)


def draw(sample_once, n_samples: int, seed: int) -> np.ndarray:
    """(n_samples, n_tokens) array of the new tokens of `sample_once(generator)`, one generator for all runs."""
    g = torch.Generator().manual_seed(seed)
    return np.stack([sample_once(g) for _ in range(n_samples)])
