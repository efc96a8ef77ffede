"""Next-item examples and identifier-level forwards for recommender training (`laser train-recommender`,
`laser train-align`).

- :func:`rec_data`: from a recommendation job's config, sliding next-item examples over each user's old
  history (history[:i] -> item i; the prompt is :func:`~pipelines.recommend.items.recommend_prompt` with
  ``recommend.max_history``, chat-templated exactly as the decoders encode it; the target is the item's
  identifier tokens + the item trie's end token, the model's first EOS id). A seeded tenth of the users
  is held out (held-out loss); users with a new history are the evaluation prompts (recall/NDCG on their
  held-out new items, :func:`beam_metrics`).
- :func:`identifier_logits`: one padded forward over prompt + sequence pairs, the head applied only at the
  positions that predict the sequence's tokens.
- :class:`PrefixRows` / :func:`model_beam_search`: constrained beam search with any per-step scoring (a
  draft/target mixture, the draft alone), each model's rows read off its prompt cache and tree-fed prefixes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

import polars as pl
import torch
from transformers import PreTrainedModel

import laser
from laser.decoders.beam.decoders import BeamDecoder
from laser.decoders.beam.search import Hyp, ItemTrie, Seq, beam_step, initial_beams
from laser.models import LoadedModel
from pipelines.recommend.config import RecommendJobConfig


@dataclass
class RecExample:
    """One next-item example: chat-templated prompt ids and the target (identifier tokens + end token)."""

    user_id: str
    item_id: str
    prompt: list[int]
    target: list[int]


@dataclass
class RecData:
    trie: ItemTrie
    codes: dict[str, list[int]]  # item_id -> identifier tokens (end token excluded)
    train: list[RecExample]
    held: list[RecExample]  # the held-out users' examples
    eval_users: list[str] = field(default_factory=list)
    eval_prompts: list[list[int]] = field(default_factory=list)  # full old history, as `laser recommend` asks
    eval_items: list[set[str]] = field(default_factory=list)  # their new-history items


def _fail(msg: str) -> Exception:
    from pipelines.knowledge.validation import JobInputError

    return JobInputError(msg)


def item_trie(lm: LoadedModel, identifiers: dict[str, str]) -> tuple[ItemTrie, dict[str, list[int]]]:
    """The item trie the recommendation workers build (end token = the model's first EOS id)."""
    tok, eos = lm.tokenizer, sorted(lm.eos_ids)
    if tok is None or not eos:
        raise _fail(f"model {lm.name!r} needs a tokenizer and an end-of-sequence token to name items")
    codes = {item: tok.encode(text, add_special_tokens=False) for item, text in identifiers.items()}
    return ItemTrie(codes, end_token=eos[0]), codes


def ordered_histories(old: pl.DataFrame, items: pl.DataFrame) -> dict[str, tuple[list, list[str]]]:
    """Per user: (history entries, item ids), oldest first, in :func:`pipelines.knowledge.prompts.user_histories`'s order."""
    from pipelines.knowledge.prompts import user_histories

    entries = user_histories(old, items)
    ids = {
        u: g["item_id"].to_list()
        for (u,), g in old.sort(["user_id", "timestamp", "item_id"]).group_by(["user_id"], maintain_order=True)
    }
    return {u: (entries[u], ids[u]) for u in entries}


def rec_data(
    cfg: RecommendJobConfig,
    lm: LoadedModel,
    held_fraction: float = 0.1,
    eval_users: int = 8,
    seed: int = 0,
    command: str = "train-recommender",
) -> RecData:
    """The job's next-item examples, held-out users and evaluation prompts (clear errors on bad input)."""
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.recommend.items import item_identifiers, recommend_prompt
    from pipelines.recommend.job import check_catalogue, held_out_items
    from pipelines.knowledge.validation import load_inputs

    data = load_inputs(partial(load_job_data, mode="paper"), cfg)
    ds, split = data.dataset, data.split
    identifiers = item_identifiers(ds.items, cfg.recommend.item_code_column)
    check_catalogue(cfg, identifiers)
    trie, codes = item_trie(lm, identifiers)
    encode = laser.get_decoder("beam", lm).encode
    end = trie.end_token
    hist = ordered_histories(split.old_interactions, ds.items)
    mh = cfg.recommend.max_history
    examples: dict[str, list[RecExample]] = {}
    for user, (entries, ids) in sorted(hist.items()):
        examples[user] = [
            RecExample(user, ids[i], encode(recommend_prompt(entries[:i], ds.domain, user, mh)), codes[ids[i]] + [end])
            for i in range(1, len(ids))
            if ids[i] in codes
        ]
    users = [u for u in sorted(examples) if examples[u]]
    if not users:
        raise _fail(
            f"{command}: no user has two old interactions (split.max_hist={cfg.split.max_hist}, "
            f"{split.old_interactions.height} old interactions): nothing to learn the next item from"
        )
    random.Random(seed).shuffle(users)
    n_held = max(1, round(len(users) * held_fraction)) if len(users) > 1 else 0
    held_users, train_users = sorted(users[:n_held]), sorted(users[n_held:])
    out = RecData(
        trie, codes, [e for u in train_users for e in examples[u]], [e for u in held_users for e in examples[u]]
    )
    held_items = held_out_items(split.new_interactions)
    for user in [u for u in sorted(held_items) if u in hist][:eval_users]:
        out.eval_users.append(user)
        out.eval_prompts.append(encode(recommend_prompt(hist[user][0], ds.domain, user, mh)))
        out.eval_items.append(held_items[user])
    return out


# ---- forwards -----------------------------------------------------------------------------------


def transformers_model(model: Any, what: str) -> PreTrainedModel:
    """``model`` as the transformers model it must be (a clear error naming ``what`` otherwise)."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"{what}: expected a transformers model, got {type(model).__name__}")
    return model


def _causal_lm(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model under a peft wrapper (LoRA layers stay injected in it)."""
    unwrap = getattr(model, "get_base_model", None)
    return transformers_model(unwrap() if unwrap is not None else model, "the model trained")


def ranking_decoder(name: str, lm: LoadedModel, **params: Any) -> BeamDecoder:
    """``laser.get_decoder(name, lm, **params)`` for a decoder that ranks items (beam, atspeed)."""
    dec = laser.get_decoder(name, lm, **params)
    if not isinstance(dec, BeamDecoder):
        raise TypeError(f"decoder {name!r} ranks no items (it has no recommend_batch)")
    return dec


def _padded(seqs: Sequence[Sequence[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.tensor([list(s) + [pad] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    return ids, mask


def identifier_logits(model: torch.nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> torch.Tensor:
    """``[sum len(seq), V]`` logits predicting each ``seq`` token after its prompt, pairs concatenated."""
    lm = _causal_lm(model)
    ids, mask = _padded([list(p) + list(s) for p, s in pairs])
    hidden = lm.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    rows = torch.cat([hidden[b, len(p) - 1 : len(p) + len(s) - 1] for b, (p, s) in enumerate(pairs)])
    return lm.get_output_embeddings()(rows).float()


def labels_of(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> torch.Tensor:
    return torch.tensor([t for _, s in pairs for t in s])


def valid_mask(trie: ItemTrie, seqs: Sequence[Sequence[int]], vocab: int) -> torch.Tensor:
    """``[sum len(seq), V]``: the tokens the trie allows at each position of each sequence."""
    rows = []
    for seq in seqs:
        for t in range(len(seq)):
            row = torch.zeros(vocab, dtype=torch.bool)
            row[trie.allowed(tuple(seq[:t]))] = True
            rows.append(row)
    return torch.stack(rows)


def rec_loss(model: torch.nn.Module, batch: Sequence[RecExample]) -> torch.Tensor:
    """Mean cross-entropy on the identifier tokens (end token included) of a batch."""
    pairs = [(e.prompt, e.target) for e in batch]
    return torch.nn.functional.cross_entropy(identifier_logits(model, pairs), labels_of(pairs))


class PrefixRows:
    """Next-token log-probabilities of sequences after one prompt: the prompt's KV is computed once and
    each sequence's last token fed once, as a tree node under its prefix (``TreeDraftModel``)."""

    def __init__(self, model: PreTrainedModel, prompt: Sequence[int]):
        from laser.decoders.beam.draft import TreeDraftModel

        self.tree = TreeDraftModel(model, prompt)
        self.root = int(prompt[-1])
        self.nodes: dict[Seq, int] = {}
        self.rows: dict[Seq, torch.Tensor] = {}

    def __call__(self, seqs: Sequence[Seq]) -> dict[Seq, torch.Tensor]:
        tokens: list[int] = []
        parents: list[int] = []
        fed: list[Seq] = []
        for seq in seqs:
            for d in range(len(seq) + 1):
                prefix = seq[:d]
                if prefix in self.nodes:
                    continue
                self.nodes[prefix] = self.tree.fed + len(tokens)
                tokens.append(prefix[-1] if prefix else self.root)
                parents.append(self.nodes[prefix[:-1]] if prefix else -1)
                fed.append(prefix)
        if tokens:
            lp = self.tree.feed(tokens, parents)
            self.rows.update({prefix: lp[i] for i, prefix in enumerate(fed)})
        return {seq: self.rows[seq] for seq in seqs}


def model_beam_search(rows: Callable[[list[Seq]], dict[Seq, torch.Tensor]], trie: ItemTrie, width: int) -> list[Hyp]:
    """Constrained beam search of ``width`` with ``rows(live sequences)`` as each step's log-probabilities."""
    hyps = initial_beams()
    while any(not h.done for h in hyps):
        hyps = beam_step(hyps, rows([h.seq for h in hyps if not h.done]), trie, width)
    return hyps


def beam_metrics(lm: LoadedModel, data: RecData, K: int) -> dict[str, float]:
    """Mean recall@K and NDCG@K of the ``beam`` decoder on the evaluation users' held-out new items."""
    from pipelines.recommend.metrics import user_metrics

    if not data.eval_prompts:
        return {"users": 0.0, f"recall@{K}": 0.0, f"ndcg@{K}": 0.0}
    lm.model.eval()
    recs = ranking_decoder("beam", lm).recommend_batch(data.eval_prompts, data.trie, K)
    pairs = [user_metrics([i for i, _ in r.items], held, K) for r, held in zip(recs, data.eval_items)]
    return {
        "users": float(len(pairs)),
        f"recall@{K}": sum(p[0] for p in pairs) / len(pairs),
        f"ndcg@{K}": sum(p[1] for p in pairs) / len(pairs),
    }
