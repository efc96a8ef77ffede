"""Generation rules applied to the target's logits inside verification, as ``generate`` applies them.

Every tree row is a different sequence (the request's tokens + the draft path to that node), so each
rule reads the row's own sequence:

- ``repetition_penalty`` θ: logits of tokens present in the sequence (prompt included) become l/θ when
  positive, l·θ when negative (transformers' RepetitionPenaltyLogitsProcessor);
- ``no_repeat_ngram_size`` n: a token that would complete an n-gram already in the sequence is banned;
- ``min_new_tokens``: end-of-sequence tokens are banned until that many tokens were generated;
- ``bad_words_ids``: a one-token entry is always banned; a longer one bans its last token when the
  sequence ends with the others.
- ``stop_strings``: decoding stops after the token that completes one of these strings (checked by the
  engine on accepted tokens, as transformers' ``StopStringCriteria``: the string must overlap the last
  token; the prompt counts; the stop string stays in the output; finish reason ``stop``).

Greedy decoding under these rules equals ``model.generate`` with the same settings (tested).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

from laser.bans import ban_index
from laser.tree import DraftTree

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class _Ruled(Protocol):
    """What the rules read of a request (``laser.request.Request``)."""

    tokens: list[int]
    rules: "GenerationRules"

    @property
    def new_tokens(self) -> list[int]: ...


@dataclass(frozen=True)
class GenerationRules:
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if any(not isinstance(x, str) or not x for x in self.stop_strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.no_repeat_ngram_size < 0 or self.min_new_tokens < 0:
            raise ValueError("no_repeat_ngram_size and min_new_tokens must be >= 0")
        object.__setattr__(self, "bad_words_ids", tuple(tuple(int(t) for t in w) for w in self.bad_words_ids))
        if any(len(w) == 0 for w in self.bad_words_ids):
            raise ValueError("bad_words_ids entries must be non-empty token sequences")

    @property
    def active(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.no_repeat_ngram_size > 0
            or self.min_new_tokens > 0
            or bool(self.bad_words_ids)
        )


NO_RULES = GenerationRules()


class TokenText:
    """Each token id's text as stop strings see it: the token's string after a fixed prefix (so a leading
    space marker reads as a space), as transformers' ``StopStringCriteria`` cleans its vocabulary."""

    PREFIX = "abcdef"

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.base: list[str] | None = None  # the prefix's tokens, made on first use (stop strings only)
        self.cache: dict[int, str] = {}

    def _pieces(self, ids: int | list[int]) -> list[str]:
        pieces = self.tokenizer.convert_ids_to_tokens(ids)
        return [pieces] if isinstance(pieces, str) else pieces

    def __call__(self, token: int) -> str:
        base = self.base
        if base is None:
            ids = self.tokenizer(self.PREFIX, add_special_tokens=False)["input_ids"]
            base = self.base = self._pieces(ids)
        if token not in self.cache:
            text = self.tokenizer.convert_tokens_to_string(base + self._pieces(int(token)))
            self.cache[token] = text[text.index(self.PREFIX) + len(self.PREFIX) :]
        return self.cache[token]


def stop_string_hit(tokens: Sequence[int], stops: Sequence[str], text: TokenText) -> bool:
    """Whether a stop string ends inside the last token of ``tokens`` (it may start tokens earlier)."""
    if not tokens or not stops:
        return False
    longest = max(map(len, stops))
    last = text(tokens[-1])
    tail, i = last, len(tokens) - 1
    while len(tail) < len(last) + longest - 1 and i > 0:
        i -= 1
        tail = text(tokens[i]) + tail
    return any(tail.find(stop, max(0, len(tail) - len(last) - len(stop) + 1)) != -1 for stop in stops)


def apply_rules(
    logits: torch.Tensor, trees: Sequence[DraftTree], requests: Sequence[_Ruled], eos_ids: set[int]
) -> torch.Tensor:
    """``[B, N, V]`` logits with each request's rules applied to each of its tree rows."""
    out = logits.clone()
    for b, (tree, req) in enumerate(zip(trees, requests)):
        if req.rules.active:
            out[b, : len(tree)] = _apply_one(out[b, : len(tree)], tree, req, eos_ids)
    return out


def _row_sequences(tree: DraftTree, context: list[int]) -> list[list[int]]:
    """The token sequence each row continues: the context (root last) + the draft path to the node."""
    seqs: list[list[int]] = [context]
    for i in range(1, len(tree)):
        seqs.append(seqs[tree.parents[i]] + [int(tree.tokens[i])])
    return seqs


def _apply_one(rows: torch.Tensor, tree: DraftTree, req: _Ruled, eos_ids: set[int]) -> torch.Tensor:
    rules, context = req.rules, req.tokens
    seqs = _row_sequences(tree, context)
    neg_inf = torch.finfo(rows.dtype).min
    if rules.repetition_penalty != 1.0:
        rows = _repetition_penalty(rows, tree, context, rules.repetition_penalty)
    banned: list[set[int]] = [set() for _ in seqs]
    if rules.no_repeat_ngram_size > 0:
        _ban_repeated_ngrams(banned, seqs, rules.no_repeat_ngram_size)
    if rules.bad_words_ids:  # as generate: a lone EOS is never a bad word
        index = ban_index(tuple(w for w in rules.bad_words_ids if len(w) > 1 or w[0] not in eos_ids))
        for i, seq in enumerate(seqs):
            banned[i] |= index.banned(seq)
    if rules.min_new_tokens > 0:
        for i in range(len(seqs)):
            if len(req.new_tokens) + int(tree.depth[i]) < rules.min_new_tokens:
                banned[i] |= eos_ids
    idx = [(i, t) for i, toks in enumerate(banned) for t in toks if 0 <= t < rows.shape[-1]]
    if idx:
        r, t = zip(*idx)
        rows[list(r), list(t)] = neg_inf
    return rows


def _repetition_penalty(rows: torch.Tensor, tree: DraftTree, context: list[int], theta: float) -> torch.Tensor:
    """Penalise, per row, the tokens present in the context or on the draft path to that row."""
    present = torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
    present[:, torch.as_tensor(sorted(set(context)), device=rows.device)] = True
    path_rows: list[int] = []
    path_toks: list[int] = []
    for i in range(1, len(tree)):
        j = i
        while j > 0:  # node i's row sees every draft token from it up to the root
            path_rows.append(i)
            path_toks.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
    if path_rows:
        present[path_rows, path_toks] = True
    penalised = torch.where(rows < 0, rows * theta, rows / theta)
    return torch.where(present, penalised, rows)


def _ban_repeated_ngrams(banned: list[set[int]], seqs: list[list[int]], n: int) -> None:
    """For each row: tokens that would repeat an n-gram of its sequence."""
    context = seqs[0]
    seen: dict[tuple[int, ...], set[int]] = defaultdict(set)
    for k in range(len(context) - n + 1):
        seen[tuple(context[k : k + n - 1])].add(context[k + n - 1])
    for i, seq in enumerate(seqs):
        if len(seq) + 1 < n:
            continue
        extra: dict[tuple[int, ...], set[int]] = defaultdict(set)
        start = max(len(context) - n + 1, 0)
        for k in range(start, len(seq) - n + 1):  # n-grams that end on the draft path
            if k + n > len(context):
                extra[tuple(seq[k : k + n - 1])].add(seq[k + n - 1])
        prefix = tuple(seq[len(seq) - n + 1 :]) if n > 1 else ()
        banned[i] |= seen.get(prefix, set()) | extra.get(prefix, set())
