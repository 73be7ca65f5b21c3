"""minispec: an educational reference implementation of speculative decoding.

Notation used everywhere (code, docstrings, lessons): ``p`` is the target distribution, ``q`` the
draft distribution, ``k`` (gamma in the papers) the number of draft tokens per round, ``alpha`` the
expected acceptance rate, ``c`` the cost of a draft step relative to a target step.

The layers, bottom-up (a module imports only from layers below it):

1. maths: :mod:`~minispec.sampling`, :mod:`~minispec.speculative`, :mod:`~minispec.tree`,
   :mod:`~minispec.theory`, :mod:`~minispec.stats`;
2. machinery: :mod:`~minispec.block_manager`, :mod:`~minispec.kv_cache`,
   :mod:`~minispec.paged_cache`, :mod:`~minispec.model`, :mod:`~minispec.fast`,
   :mod:`~minispec.eagle_head`, :mod:`~minispec.zoo`, :mod:`~minispec.loader`, :mod:`~minispec.chat`;
3. decoding: :mod:`~minispec.sequence`, :mod:`~minispec.ngram`, :mod:`~minispec.drafters`,
   :mod:`~minispec.eagle`, :mod:`~minispec.runner`, :mod:`~minispec.adaptive`, :mod:`~minispec.tree_drafters`,
   :mod:`~minispec.tree_decoding`, :mod:`~minispec.decoding`;
4. serving: :mod:`~minispec.goodput`, :mod:`~minispec.scheduler`, :mod:`~minispec.engine`;
5. faces: :mod:`~minispec.viz`, :mod:`~minispec.bench`, :mod:`~minispec.workloads`,
   :mod:`~minispec.costs`, :mod:`~minispec.zoo.eagle_data`, :mod:`~minispec.zoo.train_eagle`,
   :mod:`~minispec.cli`.

Within a layer, modules import each other in the order listed (the one round of speculative
decoding, :mod:`~minispec.runner`, sits in layer 3 because both the single-sequence loop and the
engine drive it; the EAGLE head's training recipe lives in :mod:`minispec.zoo` but drives the
engine, so it is a face). ``tests/test_layers.py`` enforces this order by parsing every import.
"""

from minispec import adaptive, bench, chat, fast, goodput, theory, viz, workloads
from minispec.adaptive import AdaptiveK
from minispec.block_manager import BlockManager
from minispec.decoding import GenerationResult, generate, speculative_generate
from minispec.drafters import (
    Draft,
    Drafter,
    ModelDrafter,
    NGramDrafter,
    PerRequestDrafter,
    PromptLookupDrafter,
)
from minispec.eagle import EagleDrafter, load_drafter
from minispec.eagle_head import EagleHead
from minispec.engine import Engine, StepOutput
from minispec.kv_cache import ContiguousKVCache, KVCache
from minispec.loader import load
from minispec.model import Llama, ModelConfig, TreeAttention
from minispec.paged_cache import PagedKVCache
from minispec.runner import SpeculativeRunner
from minispec.sampling import SamplingParams, one_hot, probs_from_logits, sample
from minispec.sequence import Sequence
from minispec.speculative import (
    GreedyVerdict,
    Verdict,
    accepts,
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
from minispec.tree_drafters import NGramTreeDrafter, TreeModelDrafter, TreeProposal

__version__ = "0.1.0"

__all__ = [
    "AdaptiveK",
    "BlockManager",
    "ContiguousKVCache",
    "Draft",
    "DraftTree",
    "EagleDrafter",
    "EagleHead",
    "Drafter",
    "Engine",
    "GenerationResult",
    "GreedyVerdict",
    "KVCache",
    "Llama",
    "NGramTreeDrafter",
    "ModelConfig",
    "ModelDrafter",
    "NGramDrafter",
    "PagedKVCache",
    "PerRequestDrafter",
    "PromptLookupDrafter",
    "SamplingParams",
    "Sequence",
    "SpeculativeRunner",
    "SpecStats",
    "StepOutput",
    "TreeAttention",
    "TreeModelDrafter",
    "TreeProposal",
    "TreeVerdict",
    "Verdict",
    "accepts",
    "check_probs",
    "generate",
    "load_drafter",
    "iterative_speculative_sample",
    "load",
    "one_hot",
    "probs_from_logits",
    "residual",
    "sample",
    "speculative_sample",
    "speculative_sample_batch",
    "speculative_generate",
    "adaptive",
    "bench",
    "chat",
    "fast",
    "goodput",
    "theory",
    "verify",
    "verify_batch",
    "verify_greedy",
    "verify_tree",
    "viz",
    "workloads",
]
