"""Speculative decoding (notebook 10-speculative): a cheap drafter proposes, the model checks every draft in one pass.

A drafter (a smaller model, or a lookup in the text so far) proposes gamma tokens; the model checks
them all in one forward pass through its cache and keeps what it would have written itself, its cache
left as its own steps would leave it. Greedy: the very tokens of greedy decoding alone. Sampled:
Leviathan et al. (arXiv 2211.17192) and Chen et al. (arXiv 2302.01318)'s rule keeps the model's
distribution exactly. Left out: batches, trees of drafts, the sampled loop on real models.
"""

from __future__ import annotations

import torch

from kvlib.course import inputs
from kvlib.course.exercises import exercise
from kvlib.kv_cache import KVCache

# ---------------------------------------------------------------------------------------------
# Drafters: propose(tokens, k) -> at most k token ids that might follow tokens


class ModelDrafter:
    """Greedy drafts from a smaller model with its own cache, kept across the calls of one generation.

    forwards counts the drafter's forward passes (one per drafted token).
    """

    def __init__(self, model, max_seq_len: int | None = None):
        self.model, self.vocab_size = model, model.config.vocab_size
        self.cache = KVCache(model.config, max_seq_len=max_seq_len)
        self.asked: list[int] = []  # the text of the last call, whose keys and values the cache holds first
        self.forwards = 0

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int) -> list[int]:
        tokens = list(tokens)
        grown = len(self.asked) < len(tokens) and tokens[: len(self.asked)] == self.asked  # the same text, longer
        self.cache.truncate(len(self.asked) if grown else 0)  # the last call's drafts go; what the text added is fed
        feed, self.asked, drafts = tokens[self.cache.pos :], tokens, []
        for _ in range(k):
            logits, _ = self.model(torch.tensor([feed]), past_key_values=self.cache)  # (1, len(feed), vocab)
            self.forwards += 1
            feed = [int(logits[0, -1].argmax())]  # the drafter's greedy token, fed next
            drafts.append(feed[0])
        return drafts


class LookupDrafter:
    """Prompt lookup (Exercise 10.4) as a drafter: no model, any vocabulary."""

    vocab_size = None

    def __init__(self, n: int = 3):
        self.n = n

    def propose(self, tokens: list[int], k: int) -> list[int]:
        return prompt_lookup(tokens, self.n, k)


# ---------------------------------------------------------------------------------------------
# Greedy speculative decoding


@exercise("10.1", validate=inputs.check_verify)
def verify_greedy(model, cache, last_token: int, draft: list[int]) -> tuple[int, int]:
    """Check drafted tokens with ONE forward pass of model through cache; keep what greedy decoding would keep.

    Shipped with two bugs (Exercise 10.1 is a find-and-fix): the checks show what goes wrong; the contract is below.

    Args:    model: called as model(ids (1, seq_len) long, past_key_values=cache) -> (logits (1, seq_len, vocab), cache);
             cache: a KVCache holding every token before last_token;
             last_token: the newest token, not in the cache yet; draft: 0 or more ids proposed to follow it
    Returns: (n_accepted, next_token): draft[:n_accepted] are the tokens greedy decoding makes after last_token,
             next_token the model's greedy token after those. On return the cache holds last_token and
             draft[:n_accepted] too, nothing more.
    Raises:  ValueError if the cache has no room for last_token and the whole draft
    Example:
        >>> from kvlib.core.weights import load_tiny; model, tokenizer = load_tiny()
        >>> ids, cache = torch.tensor([tokenizer.encode("法国的首都是")]), KVCache(model.config, max_seq_len=32)
        >>> _ = model(ids[:, :-1], past_key_values=cache)  # every token before the newest, in the cache
        >>> n, next_token = verify_greedy(model, cache, int(ids[0, -1]), draft=[])  # no draft: one decode step
        >>> n, tokenizer.decode([next_token]), cache.pos
        (0, '巴', 6)
    """
    ids = torch.tensor([[last_token, *draft]])  # the newest token and every draft: one pass
    with torch.no_grad():
        logits, _ = model(ids, past_key_values=cache)  # (1, len(draft) + 1, vocab)
    predicted = logits[0].argmax(-1).tolist()  # predicted[i]: the model's token after ids[0, i]
    n_accepted = sum(d == p for d, p in zip(draft, predicted))  # the drafts the model agrees with
    return n_accepted, predicted[n_accepted]


@exercise("10.2", validate=inputs.check_speculative_generate)
def speculative_generate(
    model, drafter, input_ids: torch.Tensor, max_new_tokens: int, gamma: int, eos_token: int | None = None, cache=None
) -> torch.Tensor:
    """Greedy decoding with drafts: the tokens of greedy cached decoding, in fewer forward passes of model.

    Args:    model: called as in verify_greedy; drafter: drafter.propose(tokens: list[int], k) -> at most k ids;
             input_ids: (1, seq_len) long; gamma >= 1: the most tokens drafted per pass; eos_token: generation stops
             right after the model makes it (returned); cache: reset first, or None for a new KVCache
    Returns: (1, seq_len + n_new) long, n_new <= max_new_tokens (fewer only when eos_token came): greedy decoding's
             tokens, in as few forward passes of model as these drafts allow, none verifying more than gamma drafts.
             On return the cache holds what plain cached decoding (generate_cached) leaves in it.
    Raises:  ValueError for gamma < 1, a drafter with another vocabulary, or a cache without room for seq_len +
             max_new_tokens tokens
    Example:
        >>> from kvlib.core.weights import load_tiny; from kvlib.kv_cache import generate_cached
        >>> model, tokenizer = load_tiny(); ids = torch.tensor([tokenizer.encode("法国的首都是")])
        >>> torch.equal(speculative_generate(model, LookupDrafter(), ids, 8, gamma=4), generate_cached(model, ids, 8))
        True
    """
    raise NotImplementedError("Exercise 10.2 (notebooks/10-speculative): speculative_generate")


# ---------------------------------------------------------------------------------------------
# How many tokens a pass makes: a prediction


@exercise("10.5", validate=inputs.check_tokens_per_pass)
def tokens_per_pass(alpha: float, gamma: int) -> float:
    """Predict: the tokens one verify pass makes, on average, when each draft is kept with probability alpha.

    The drafts are checked in order and the first rejected one ends the pass; each is kept with probability alpha,
    whatever happened before (independently). The pass's tokens: the kept drafts and the model's own token.
    Args:    alpha: a float in [0, 1]; gamma: an int >= 0, the drafts per pass
    Returns: float, the expected tokens of one pass, between 1 and gamma + 1
    Raises:  ValueError if alpha is outside [0, 1] or gamma is not an int >= 0
    Example:
        >>> tokens_per_pass(0.0, 4), tokens_per_pass(1.0, 4)  # every draft rejected; every draft kept
        (1.0, 5.0)
    """
    raise NotImplementedError("Exercise 10.5 (notebooks/10-speculative): tokens_per_pass")


# ---------------------------------------------------------------------------------------------
# Exact speculative sampling


@exercise("10.3", validate=inputs.check_accept_sampled)
def accept_sampled(
    p: torch.Tensor, q: torch.Tensor, draft: list[int], generator: torch.Generator | None = None
) -> list[int]:
    """One round of speculative sampling: tokens distributed exactly as sampling each from the model would give.

    Args:    p: (gamma + 1, vocab) float, the model's probabilities for the token after the newest kept one (row 0)
             and after each drafted token (row i + 1 after draft[i]); q: (gamma, vocab) float, the drafter's
             probabilities draft[i] was sampled from; draft: gamma ids; generator: every random draw comes from it
    Returns: list of 1 to gamma + 1 ids: the accepted drafts, then one token the model's rule picks. Over many calls
             the first token follows p[0], and each later one p's row after the tokens before it, whatever q is.
    Raises:  ValueError if p or q is not a table of probabilities of those shapes, or a draft id is out of range
    Example:
        >>> p = torch.tensor([[0.5, 0.5], [0.2, 0.8]])  # gamma 1, vocab 2
        >>> len(accept_sampled(p, p[:1].clone(), [1], torch.Generator().manual_seed(0)))  # q == p: every draft kept
        2
    """
    raise NotImplementedError("Exercise 10.3 (notebooks/10-speculative): accept_sampled")


# ---------------------------------------------------------------------------------------------
# A drafter without a model


@exercise("10.4", validate=inputs.check_prompt_lookup)
def prompt_lookup(tokens: list[int], n: int, k: int) -> list[int]:
    """Drafts without a model: the text's own guess at what follows its last n tokens, copied from earlier in it.

    Args:    tokens: the text so far (prompt and generated ids); n >= 1: tokens to match; k >= 1: the most to propose
    Returns: at most k ids copied from tokens; the examples below are the contract: which earlier place counts
             when the last n tokens stood at several, where such a place may sit, and what comes back at the
             text's end or when they stood nowhere earlier
    Raises:  ValueError if n or k is below 1
    Example:
        >>> prompt_lookup([1, 2, 3, 9, 1, 2], n=2, k=3)
        [3, 9, 1]
        >>> prompt_lookup([5, 1, 2, 7, 1, 2, 8, 1, 2], n=2, k=1), prompt_lookup([4, 4, 4], n=2, k=3)
        ([8], [4])
        >>> prompt_lookup([1, 2, 3, 2], n=2, k=3), prompt_lookup([3, 1, 2, 3], n=1, k=5)
        ([], [1, 2, 3])
    """
    raise NotImplementedError("Exercise 10.4 (notebooks/10-speculative): prompt_lookup")
