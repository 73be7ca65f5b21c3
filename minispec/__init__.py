"""minispec: an educational reference implementation of speculative decoding.

Notation: ``p`` target, ``q`` draft, ``k`` (gamma) drafts per round, ``alpha`` acceptance, ``c``
and ``r`` a draft step's and a ``k + 1``-token verify's cost, in target steps.

**The core** -- what a student reads, and all the package needs to run: five folders, read
bottom-up, each importing only from itself and the ones below (``tests/test_layers.py``):

1. [`minispec.core`][minispec.core] -- the maths: sampling, the accept walk, trees, theory.
2. [`minispec.models`][minispec.models] -- a minimal Llama and its KV caches.
3. [`minispec.drafters`][minispec.drafters] -- the ``Drafter`` interface, the draft model, n-grams.
4. [`minispec.decoding`][minispec.decoding] -- the one round, requests, ``speculative_generate``.
5. [`minispec.serving`][minispec.serving] -- continuous batching: scheduler, ``Engine``.

**The wings** -- folders that import the core and are handed to it, never imported by it:
[`minispec.speed`][minispec.speed] (the packed CPU path, static steps and CUDA graphs, the
goodput draft-length policy), [`minispec.extra_drafters`][minispec.extra_drafters] (suffix,
hybrid, EAGLE heads, dynamic trees), [`minispec.loading`][minispec.loading] (``load``, the
[`minispec.zoo`][minispec.zoo]) and [`minispec.grammar`][minispec.grammar] (a grammar on a
request). This module wires the wings' defaults in (below).

**Around them**: [`minispec.check`][minispec.check] (graders) and
[`minispec.tools`][minispec.tools] (not imported here).
"""

from minispec import check, grammar
from minispec.core import theory
from minispec.core.constraint import FACTORIES
from minispec.core.sampling import SamplingParams, probs_from_logits, sample
from minispec.core.sequence import Sequence
from minispec.core.speculative import (
    Draft,
    Verdict,
    iterative_speculative_sample,
    residual,
    speculative_sample,
    verify,
)
from minispec.core.stats import SpecStats
from minispec.core.tree import DraftTree, Proposal
from minispec.decoding.loop import GenerationResult, generate, speculative_generate
from minispec.decoding.runner import DEFAULTS
from minispec.drafters.base import Drafter
from minispec.drafters.model import ModelDrafter
from minispec.drafters.ngram import DRAFTERS, NGramDrafter, PromptLookupDrafter
from minispec.extra_drafters.dynamic import DynamicTree
from minispec.extra_drafters.eagle import EagleDrafter, load_drafter
from minispec.extra_drafters.hybrid import HybridDrafter
from minispec.extra_drafters.suffix import SuffixDrafter
from minispec.loading import prompts
from minispec.loading.loader import load
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import Llama
from minispec.models.paged_cache import PagedKVCache
from minispec.serving.engine import Engine, StepOutput
from minispec.speed.defaults import collaborators

# the wings' defaults, wired here so that the core never imports a wing: the Engine's goodput k,
# CUDA graphs on a GPU, prompts of text and chat messages, the drafter named "suffix", grammars
DEFAULTS.speed = collaborators
DEFAULTS.prompts = prompts
DRAFTERS["suffix"] = SuffixDrafter
FACTORIES.append(grammar.constraint_for)     # requests with a json_schema or regex get a grammar

__version__ = "0.1.0"

__all__ = [
    # core: the maths
    "DraftTree", "DynamicTree", "Proposal", "SamplingParams", "Sequence", "SpecStats",
    "iterative_speculative_sample", "probs_from_logits", "residual", "sample", "Verdict",
    "speculative_sample", "theory", "verify",
    # models
    "ContiguousKVCache", "Llama", "PagedKVCache", "load",
    # drafters
    "Draft", "Drafter", "EagleDrafter", "HybridDrafter", "ModelDrafter", "NGramDrafter",
    "PromptLookupDrafter", "SuffixDrafter", "load_drafter",
    # decoding
    "GenerationResult", "generate", "speculative_generate",
    # serving
    "Engine", "StepOutput",
    # coursework graders
    "check",
]
