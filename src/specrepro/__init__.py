"""specrepro: speculative decoding (Leviathan et al. 2022; Chen et al. 2023) put to the test on real models.

Notation throughout: p = target distribution, q = draft distribution, gamma = draft tokens per iteration
(see `specrepro.sampling`).
"""

from .generate import GenerationResult, GenerationStats, autoregressive_generate, speculative_generate
from .sampling import SamplingConfig, speculative_accept

__all__ = ["GenerationResult", "GenerationStats", "SamplingConfig", "autoregressive_generate",
           "speculative_accept", "speculative_generate"]
__version__ = "0.1.0"
