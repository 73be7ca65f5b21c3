"""Suffix drafting: continue the longest suffix match of the context, in the request's own text
and, opt-in, in a store of earlier requests (SuffixDecoding, Oliaro et al. 2024; SAM-Decoding,
Hu et al. 2024).

Each round the drafter looks for the longest suffix of the context (at most ``max_match``
tokens) that occurred before -- earlier in the request's own prompt and output, or in a document
of a [`SuffixStore`][minispec.extra_drafters.suffix.SuffixStore] -- and proposes what followed it.
Where the match occurred several times, the continuation is the most frequent one, token by token
(ties: the most recent occurrence), as SuffixDecoding walks its suffix tree; the walk stops when
the path's empirical probability falls below ``min_prob``. Drafts are deterministic, so ``q`` is
one-hot (``Draft.probs is None``) and sampling stays exact.

**The data structure** is an inverted index: documents (lists of token ids) and, per token id,
the positions where it occurs (why not a suffix trie or automaton:
[`SuffixStore`][minispec.extra_drafters.suffix.SuffixStore]). A lookup scans the positions of the
context's last token, newest first, and measures how far back each occurrence agrees with the
context: it costs O(``max_candidates`` x match length), and "longest" means longest among the
``max_candidates`` most recent occurrences (256 by default: in Python, a small fraction of a real
model's forward; the results page).

**Memory**: a request's own index holds its context; a store is bounded (``SuffixStore``).

**Privacy**: a shared store drafts one request's text into another's (outputs stay exact, the
*drafts* do not): read [`SuffixStore`][minispec.extra_drafters.suffix.SuffixStore]'s note, and give
each request a ``tenant`` where requests may not see each other's text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minispec.core.sampling import check_args, is_int, is_real
from minispec.core.sequence import Sequence
from minispec.core.tree import Proposal
from minispec.drafters.ngram import ContextDrafter
from minispec.drafters.trees import grow_tree

__all__ = ["Match", "SuffixDrafter", "SuffixStore"]

Position = tuple[int, int]            # (document id, index of a token in it)


@dataclass
class Match:
    """Where the context's suffix occurred: what a proposal continues.

    Attributes:
        length: tokens of the context matched (0: no match).
        ends: ``(doc, i)`` of each occurrence of the longest match (``docs[doc][i]`` is its last
            token), newest first.
        docs: the documents they are in.
        wraps: reading past a document's end continues with the draft itself (the request's own
            text: the draft extends that very document).
    """

    length: int
    ends: list[Position]
    docs: dict[int, list[int]]
    wraps: bool = False

    def following(self, ends: list[Position], path: list[int]) -> list[tuple[int, list[Position]]]:
        """The tokens that follow ``path`` after the occurrences ``ends``, most frequent first
        (ties: the newest occurrence's), each with the occurrences that continue with it."""
        groups: dict[int, list[Position]] = {}
        for doc, end in ends:
            text, i = self.docs[doc], end + 1 + len(path)
            if i < len(text):
                token = text[i]
            elif self.wraps:
                token = path[i - len(text)]       # i - len(text) < len(path): end < len(text) - 1
            else:
                continue                          # this occurrence's document stops here
            groups.setdefault(token, []).append((doc, end))
        return sorted(groups.items(), key=lambda item: -len(item[1]))     # stable: newest first


class SuffixStore:
    """Documents of token ids with an index of where each token occurs, bounded by eviction.

    Pass one store to several drafters (``SuffixDrafter(store=...)``) to let requests draft from
    each other's text: each request writes its prompt and accepted tokens into a document of its
    own as it goes, and drafts from every other document of its tenant. Outputs stay exact: a
    store changes only which drafts are proposed.

    **Privacy.** The drafts are another request's text: after a request whose prompt held a
    password, a request whose text matches the words before it may be *drafted* the password (in
    its ``rounds``, and in its timing; verify then rejects it unless the target says it too).
    Share a store only between requests that may read each other's text, or tag them with tenants
    (the ``tenant=`` of [`Engine.add_request`][minispec.serving.engine.Engine.add_request] and
    ``Engine.generate``, or ``SuffixDrafter(store, tenant=...)``): every document belongs to the
    tenant of the request that wrote it (``None``: the shared pool of requests without one), and
    ``find`` scans the positions of one tenant only, so a tenant's text is never drafted into
    another's request.

    **Why an index.** A suffix trie of depth ``D`` holds up to ``D`` nodes per token
    (SuffixDecoding uses ``D`` = 24..64: millions of Python objects for a 100k-token store); a
    suffix automaton finds the longest match in amortized O(1) but cannot forget a document
    (eviction means rebuilding it) and knows only the first occurrence unless every insertion walks
    its suffix links. The index is two dicts a student reads in a minute, forgets a document by
    dropping it, and gives the latest occurrence, the match length and continuation counts
    directly; its price is the lookup's scan (module docstring).

    **Memory.** A request's own index holds its context (bounded by its ``max_seq_len``); a store
    holds at most ``max_tokens`` tokens in at most ``max_docs`` documents, oldest evicted first,
    and at most ``2 * max_tokens`` positions (evicted documents leave stale positions behind,
    dropped once they are as many as the live ones).

    Args:
        max_tokens: most tokens kept over all documents (``None``: no limit); when exceeded, the
            oldest documents are dropped (a document longer than this is not kept at all).
        max_docs: most documents kept (oldest dropped first).
    """

    def __init__(self, max_tokens: int | None = 65536, max_docs: int = 4096) -> None:
        check_args("SuffixStore", [
            ("max_tokens", max_tokens,
             max_tokens is None or (is_int(max_tokens) and max_tokens >= 1),
             "an integer >= 1 or None"),
            ("max_docs", max_docs, is_int(max_docs) and max_docs >= 1, "an integer >= 1")])
        self.max_tokens, self.max_docs = max_tokens, max_docs
        self.docs: dict[int, list[int]] = {}          # doc id -> tokens; dict order = age
        self.tenants: dict[int, str | None] = {}      # doc id -> the tenant that wrote it
        # (tenant, token) -> where it occurs, as added: a lookup reads one tenant's positions
        self.positions: dict[tuple[str | None, int], list[Position]] = {}
        self.num_tokens = 0                           # tokens in live documents
        self.num_positions = 0                        # positions held, stale ones included
        self._next_doc = 0

    def open(self, tenant: str | None = None) -> int:
        """A new, empty document of ``tenant`` (the newest); its id."""
        doc, self._next_doc = self._next_doc, self._next_doc + 1
        self.docs[doc], self.tenants[doc] = [], tenant
        self._evict()
        return doc

    def extend(self, doc: int, tokens: list[int]) -> None:
        """Append ``tokens`` to document ``doc`` (nothing if it was evicted), then evict."""
        if (text := self.docs.get(doc)) is None:
            return
        for token in tokens:
            self.positions.setdefault((self.tenants[doc], token), []).append((doc, len(text)))
            text.append(token)
        self.num_tokens += len(tokens)
        self.num_positions += len(tokens)
        self._evict()

    def _evict(self) -> None:
        """Drop the oldest documents while over a limit; forget stale positions once they are
        as many as the live ones (amortized O(1) per token)."""
        while self.docs and (len(self.docs) > self.max_docs or
                             (self.max_tokens is not None and self.num_tokens > self.max_tokens)):
            oldest = next(iter(self.docs))
            self.num_tokens -= len(self.docs.pop(oldest))
            del self.tenants[oldest]
        if self.num_positions > 2 * self.num_tokens:
            live = {t: kept for t, ps in self.positions.items()
                    if (kept := [p for p in ps if p[0] in self.docs])}
            self.positions, self.num_positions = live, self.num_tokens

    def find(self, pattern: list[int], max_candidates: int = 256, exclude: int | None = None,
             tenant: str | None = None) -> Match:
        """The longest suffix of ``pattern`` that occurs with at least one token after it, in the
        documents of ``tenant``.

        Scans the occurrences of ``pattern[-1]`` in ``tenant``'s documents newest first (at most
        ``max_candidates`` of them, skipping document ``exclude``) and keeps every one with the
        longest agreement.
        """
        best, ends, seen = 0, [], 0
        for doc, end in reversed(self.positions.get((tenant, pattern[-1]), ())) if pattern else ():
            if (text := self.docs.get(doc)) is None or doc == exclude or end + 1 >= len(text):
                continue                          # evicted, excluded, or nothing follows it
            n = 1
            while n < len(pattern) and n <= end and text[end - n] == pattern[-1 - n]:
                n += 1
            if n > best:
                best, ends = n, []
            if n == best:
                ends.append((doc, end))
            seen += 1
            if seen == max_candidates:
                break
        return Match(best, ends, self.docs)


class SuffixDrafter(ContextDrafter):
    """Drafts the continuation of the longest suffix match (module docstring); one request at a
    time, like [`PromptLookupDrafter`][minispec.drafters.ngram.PromptLookupDrafter].

    Each ``lookup`` syncs the drafter's own index with ``context`` (a context that does not
    extend the last one is a new request: the index starts over) and writes the new tokens into
    its document of ``store``, if any. A copy (``clone``, which ``propose`` makes per request)
    is of the same class (a subclass keeps its overrides), shares the store and starts with an
    empty index; a request's copy writes and drafts as ``seq.tenant`` when the request has one.

    Args:
        store: a [`SuffixStore`][minispec.extra_drafters.suffix.SuffixStore] shared with other
            requests, or ``None``: the request's own text only. Read its privacy note: a shared
            store drafts one request's text into another's.
        max_match: longest suffix looked up.
        min_match: shortest match worth a draft.
        draft_factor: draft at most ``ceil(draft_factor * match length)`` tokens (short matches
            are weak evidence; SuffixDecoding's ``max_spec_factor``), ``None``: always ``k``.
        min_prob: stop when the empirical probability of the drafted path falls below this.
        max_candidates: occurrences of the last token examined per source and round.
        tenant: whose documents of ``store`` it writes and drafts from (``None``: the shared pool
            of requests without a tenant); a request's own ``tenant`` (the ``tenant=`` of
            [`Engine.add_request`][minispec.serving.engine.Engine.add_request]) comes first.

    Attributes:
        last_match: tokens of context the last draft was matched on (0: none).
        last_source: ``"context"``, ``"store"`` or ``None`` (no draft).
    """

    def __init__(self, store: SuffixStore | None = None, *, max_match: int = 32, min_match: int = 1,
                 draft_factor: float | None = 1.0, min_prob: float = 0.1,
                 max_candidates: int = 256, tenant: str | None = None) -> None:
        check_args("SuffixDrafter", [
            ("store", store, store is None or isinstance(store, SuffixStore),
             "a SuffixStore or None"),
            ("max_match", max_match, is_int(max_match) and max_match >= 1, "an integer >= 1"),
            ("min_match", min_match, is_int(min_match) and 1 <= min_match  # max_match: above
             and (not is_int(max_match) or min_match <= max_match),
             f"an integer in [1, max_match={max_match!r}]"),
            ("draft_factor", draft_factor,
             draft_factor is None or (is_real(draft_factor) and draft_factor > 0),
             "a finite number > 0 or None"),
            ("min_prob", min_prob, is_real(min_prob) and 0 <= min_prob <= 1, "a number in [0, 1]"),
            ("max_candidates", max_candidates, is_int(max_candidates) and max_candidates >= 1,
             "an integer >= 1"),
            ("tenant", tenant, tenant is None or isinstance(tenant, str), "a string or None")])
        self.store, self.tenant = store, tenant
        self.max_match, self.min_match, self.draft_factor = max_match, min_match, draft_factor
        self.min_prob, self.max_candidates = min_prob, max_candidates
        super().__init__()

    def reset(self) -> None:
        """Forget the request (its document in the store stays, and ages out)."""
        self.last_match, self.last_source = 0, None
        self.own = SuffixStore(max_tokens=None)        # the request's context: document 0
        self.own.open()
        self.doc: int | None = None                    # its document in the store, once opened

    def __deepcopy__(self, memo: dict) -> SuffixDrafter:
        """A copy of the same class and settings (a subclass's own state deep-copied), sharing the
        store, with an empty index."""
        memo[id(self.store)] = self.store
        return super().__deepcopy__(memo)

    def for_request(self, seq: Sequence) -> SuffixDrafter:
        """A fresh state for ``seq``, writing and drafting as its tenant if it has one."""
        state = self.clone()
        state.tenant = self.tenant if seq.tenant is None else seq.tenant
        return state

    def sync(self, context: list[int]) -> None:
        """Index the tokens of ``context`` not seen yet (start over if it is another request)."""
        if context[:len(self.own.docs[0])] != self.own.docs[0]:
            self.reset()
        new = context[len(self.own.docs[0]):]                # the request's text so far: doc 0
        self.own.extend(0, new)
        if self.store is not None and new:
            if self.doc is None:
                self.doc = self.store.open(self.tenant)
            self.store.extend(self.doc, new)

    def match(self, context: list[int]) -> Match:
        """Sync, then the longer of the matches in the request's own text and in the store (the
        own text on ties); ``last_match`` and ``last_source`` say which."""
        self.sync(context)
        pattern = context[-self.max_match:]
        match = self.own.find(pattern, self.max_candidates)
        match.wraps, self.last_source = True, "context"
        if self.store is not None:
            other = self.store.find(pattern, self.max_candidates, self.doc, self.tenant)
            if other.length > match.length:
                match, self.last_source = other, "store"
        if match.length < self.min_match:
            match, self.last_source = Match(0, [], {}), None
        self.last_match = match.length
        return match

    def lookup_tree(self, context: list[int], branching: tuple[int, ...]) -> Proposal:
        """A tree after ``context``: at each node, the ``b`` most frequent tokens that followed
        the occurrences of the longest match still agreeing with the node's path; a child whose
        path probability (its share of the occurrences, multiplied down the tree) falls below
        ``min_prob`` is not proposed. A short match is weak evidence: the depth is capped at
        ``ceil(draft_factor * match length)``. ``lookup`` (a chain) is this tree with one child
        per node: the most frequent continuation."""
        match = self.match(context)

        def children(_: int, state: tuple[list, list[int], float], b: int):
            ends, path, prob = state                 # occurrences, path, path probability
            options = match.following(ends, path)
            total = sum(len(e) for _, e in options)
            for token, kept in options[:b]:
                if prob * (len(kept) / total) < self.min_prob:
                    break                            # options are most frequent first
                yield token, None, (kept, path + [token], prob * (len(kept) / total))

        depth = (len(branching) if self.draft_factor is None
                 else math.ceil(self.draft_factor * match.length))    # no match: no occurrences
        proposal = grow_tree(context[-1], branching[:depth], (match.ends, [], 1.0), children)
        if proposal.depth == 0:
            self.last_source = None
        return proposal
