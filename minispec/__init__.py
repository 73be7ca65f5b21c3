"""minispec: an educational reference implementation of speculative decoding.

Notation everywhere (code, docstrings, lessons): ``p`` the target distribution, ``q`` the draft's,
``k`` (gamma in the papers) draft tokens per round, ``alpha`` the expected acceptance rate, ``c``
a draft step's cost and ``r`` the cost of verifying ``k + 1`` tokens, both in target steps.

Layers, one folder each, read bottom-up; a module imports only from its own folder or the ones
below it (``tests/test_layers.py`` checks it):

1. [`minispec.core`][minispec.core] -- the maths: sampling, the accept rule, trees, theory,
   statistics, one request's bookkeeping. Tensors in, tensors out; no model, no cache.
2. [`minispec.zoo`][minispec.zoo] -- the registry of shipped and fetched models (names to folders).
3. [`minispec.models`][minispec.models] -- a minimal Llama, KV caches (contiguous and paged), the
   loader, chat templates, the EAGLE head, the packed CPU path.
4. [`minispec.drafters`][minispec.drafters] -- who proposes drafts: the ``Drafter`` base class,
   a draft model, n-gram tables and prompt lookup, an EAGLE head, and their tree forms.
5. [`minispec.decoding`][minispec.decoding] -- the one speculative round, the single-sequence loop
   (``generate``, ``speculative_generate``), request validation, the draft-length policy.
6. [`minispec.serving`][minispec.serving] -- continuous batching: scheduler, ``Engine``.
7. [`minispec.check`][minispec.check] -- graders for a student's own implementation of the pieces
   above (``ms.check.verifier(fn)`` ...), and a lab of real bugs they catch.
8. [`minispec.tools`][minispec.tools] -- benchmarks, cost reports, workloads, pictures, the command
   line, the training recipes; not imported here: ``from minispec.tools import viz``.

Re-exports the coursework API; registers the wing [`minispec.grammar`][minispec.grammar].
"""

from minispec import check, grammar
from minispec.core import theory
from minispec.core.constraint import FACTORIES
from minispec.core.sampling import SamplingParams, probs_from_logits, sample
from minispec.core.sequence import Sequence
from minispec.core.speculative import (
    Verdict,
    iterative_speculative_sample,
    residual,
    speculative_sample,
    verify,
)
from minispec.core.stats import SpecStats
from minispec.core.tree import DraftTree, DynamicTree, Proposal
from minispec.decoding.loop import GenerationResult, generate, speculative_generate
from minispec.drafters.base import Draft, Drafter, ModelDrafter
from minispec.drafters.eagle import EagleDrafter, load_drafter
from minispec.drafters.hybrid import HybridDrafter
from minispec.drafters.ngram import NGramDrafter, PromptLookupDrafter
from minispec.drafters.suffix import SuffixDrafter
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import Llama
from minispec.models.loader import load
from minispec.models.paged_cache import PagedKVCache
from minispec.serving.engine import Engine, StepOutput

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
