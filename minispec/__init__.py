"""minispec: an educational reference implementation of speculative decoding.

Notation used everywhere (code, docstrings, lessons): ``p`` is the target distribution, ``q`` the
draft distribution, ``k`` (gamma in the papers) the number of draft tokens per round, ``alpha`` the
expected acceptance rate, ``c`` the cost of a draft step relative to a target step.

The layers, bottom-up (a module imports only from layers below it):

1. maths: [`sampling`][minispec.sampling], [`speculative`][minispec.speculative],
   [`tree`][minispec.tree], [`theory`][minispec.theory], [`stats`][minispec.stats];
2. machinery: [`block_manager`][minispec.block_manager], [`kv_cache`][minispec.kv_cache],
   [`paged_cache`][minispec.paged_cache], [`model`][minispec.model], [`fast`][minispec.fast],
   [`eagle_head`][minispec.eagle_head], [`zoo`][minispec.zoo], [`loader`][minispec.loader],
   [`chat`][minispec.chat];
3. decoding: [`sequence`][minispec.sequence], [`ngram`][minispec.ngram],
   [`drafters`][minispec.drafters], [`eagle`][minispec.eagle], [`runner`][minispec.runner],
   [`adaptive`][minispec.adaptive], [`tree_drafters`][minispec.tree_drafters],
   [`tree_decoding`][minispec.tree_decoding], [`decoding`][minispec.decoding];
4. serving: [`goodput`][minispec.goodput], [`scheduler`][minispec.scheduler],
   [`engine`][minispec.engine];
5. faces: [`viz`][minispec.viz], [`bench`][minispec.bench], [`workloads`][minispec.workloads],
   [`costs`][minispec.costs], ``minispec.zoo.eagle_data``, ``minispec.zoo.train_eagle``,
   ``minispec.cli``.

Within a layer, modules import each other in the order listed (the one round of speculative
decoding, [`runner`][minispec.runner], sits in layer 3 because both the single-sequence loop and
the engine drive it; the EAGLE head's training recipe lives in [`minispec.zoo`][minispec.zoo] but
drives the engine, so it is a face). ``tests/test_layers.py`` enforces this order by parsing every
import.
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
