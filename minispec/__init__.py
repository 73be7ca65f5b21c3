"""minispec: an educational reference implementation of speculative decoding.

Notation used everywhere (code, docstrings, lessons): ``p`` is the target distribution, ``q`` the
draft distribution, ``k`` (gamma in the papers) the number of draft tokens per round, ``alpha`` the
expected acceptance rate, ``c`` the cost of a draft step relative to a target step.
"""

from minispec import theory
from minispec.sampling import SamplingParams, probs_from_logits, sample
from minispec.speculative import (
    Verdict,
    residual,
    speculative_sample,
    speculative_sample_batch,
    verify,
    verify_batch,
)
from minispec.tree import DraftTree, TreeVerdict, iterative_speculative_sample, verify_tree

__version__ = "0.1.0"

__all__ = [
    "DraftTree",
    "SamplingParams",
    "TreeVerdict",
    "Verdict",
    "iterative_speculative_sample",
    "probs_from_logits",
    "residual",
    "sample",
    "speculative_sample",
    "speculative_sample_batch",
    "theory",
    "verify",
    "verify_batch",
    "verify_tree",
]
