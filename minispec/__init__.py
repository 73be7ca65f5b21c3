"""minispec: an educational reference implementation of speculative decoding.

Notation used everywhere (code, docstrings, lessons): ``p`` is the target distribution, ``q`` the
draft distribution, ``k`` (gamma in the papers) the number of draft tokens per round, ``alpha`` the
expected acceptance rate, ``c`` the cost of a draft step relative to a target step.

The layers, bottom-up (a module imports only from layers below it):

1. maths: :mod:`~minispec.sampling`, :mod:`~minispec.speculative`, :mod:`~minispec.tree`,
   :mod:`~minispec.theory`, :mod:`~minispec.stats`;
2. machinery: :mod:`~minispec.model`, :mod:`~minispec.kv_cache`, :mod:`~minispec.paged_cache`,
   :mod:`~minispec.block_manager`, :mod:`~minispec.loader`;
3. decoding: :mod:`~minispec.drafters`, :mod:`~minispec.adaptive`, :mod:`~minispec.decoding`;
4. serving: :mod:`~minispec.engine`, :mod:`~minispec.runner`, :mod:`~minispec.scheduler`,
   :mod:`~minispec.sequence`;
5. faces: :mod:`~minispec.viz`, :mod:`~minispec.bench`, :mod:`~minispec.cli`.
"""

from minispec import adaptive, bench, theory, viz
from minispec.adaptive import AdaptiveK
from minispec.block_manager import BlockManager
from minispec.decoding import GenerationResult, generate, speculative_generate
from minispec.drafters import Draft, ModelDrafter, NGramDrafter, PromptLookupDrafter
from minispec.engine import Engine, StepOutput
from minispec.kv_cache import ContiguousKVCache, KVCache
from minispec.loader import load
from minispec.model import Llama, ModelConfig
from minispec.paged_cache import PagedKVCache
from minispec.sampling import SamplingParams, probs_from_logits, sample
from minispec.speculative import (
    GreedyVerdict,
    Verdict,
    check_probs,
    residual,
    speculative_sample,
    speculative_sample_batch,
    verify,
    verify_batch,
    verify_greedy,
)
from minispec.stats import SpecStats
from minispec.tree import DraftTree, TreeVerdict, iterative_speculative_sample, verify_tree

__version__ = "0.1.0"

__all__ = [
    "AdaptiveK",
    "BlockManager",
    "ContiguousKVCache",
    "Draft",
    "DraftTree",
    "Engine",
    "GenerationResult",
    "GreedyVerdict",
    "KVCache",
    "Llama",
    "ModelConfig",
    "ModelDrafter",
    "NGramDrafter",
    "PagedKVCache",
    "PromptLookupDrafter",
    "SamplingParams",
    "SpecStats",
    "StepOutput",
    "TreeVerdict",
    "Verdict",
    "check_probs",
    "generate",
    "iterative_speculative_sample",
    "load",
    "probs_from_logits",
    "residual",
    "sample",
    "speculative_sample",
    "speculative_sample_batch",
    "speculative_generate",
    "adaptive",
    "bench",
    "theory",
    "verify",
    "verify_batch",
    "verify_greedy",
    "verify_tree",
    "viz",
]
