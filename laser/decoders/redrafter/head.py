"""ReDrafter (Cheng et al. 2024): a recurrent draft head on the target's last hidden state, beam-search
drafts, and dynamic tree attention (the beams' shared prefixes packed into one draft tree).

- :class:`RecurrentDraftHead`: ``s_1 = SiLU(W e(g) + b)``, ``s_t = SiLU(W e(x_{t-1}) + U s_{t-1} + b)`` over the
  target's frozen input embeddings ``e``; ``x = [h; s_t]`` through residual blocks ``x + SiLU(Linear(x))``;
  then a vocabulary head. Heads (``kind``): ``full`` (its own ``2d -> V`` matrix), ``tied`` (``2d -> d``
  then the target's frozen output matrix) or ``shortlist`` (``2d -> d`` then the frozen output rows of
  the ``K`` tokens the target writes most, plus a learned bias: drafts only ever use those tokens).
- :func:`beam_search`: width BW, length L (the guaranteed token included), for many requests at once.
- :func:`prefix_tree`, :func:`pack_beams`: the corrected tensor form of the paper's Listing 1 (see the
  implementation notes): ``prefix_tree[r, i, k]`` is the smallest beam sharing beam i's first k+1
  tokens; the nodes a beam owns are packed, ``packed[unpacker] == beams``.
- :class:`ReDrafter`: the per-request drafter (``needs_hidden``), batched by ``propose_batch``.
- :class:`PaperSamplingVerifier`: the paper's sampling rule (u < p/q per beam, longest prefix,
  residual ``norm(relu(p - q))``; not provably exact). Greedy rows are verified greedily (exact).

The engine's tree, mask and KV compaction do the rest: no second tree implementation here.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from laser.drafting import Drafter
from laser.request import Request
from laser.sampling import GREEDY, SamplingParams, sample, target_probs
from laser.tree import DraftTree, TreeBatch
from laser.verify import Outcome, TopKVerifier, Verifier

log = logging.getLogger(__name__)

HEAD_KINDS = ("full", "tied", "shortlist")
FORMAT = "laser-redrafter-head/1"


def head_path(head: str | Path) -> Path:
    """Where a head lives: a path as given (``.pt`` file or with a folder), else ``<laser cache>/heads/<name>.pt``
    beside the model cache."""
    from laser.models import cache_dir

    text = str(head)
    if not text or text.strip() != text:
        raise ValueError(f"bad ReDrafter head name {head!r}")
    if text.endswith(".pt") or "/" in text or text.startswith("~"):
        return Path(text).expanduser()
    return cache_dir() / "heads" / f"{text}.pt"


def _weight(module: nn.Module | None, what: str) -> torch.Tensor:
    """The weight matrix of one of a target's embedding modules."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"the target model's {what} embeddings have no weight matrix")
    return weight


def input_embeddings(model: PreTrainedModel) -> torch.Tensor:
    """``[V, d]``: the target's input embedding matrix."""
    return _weight(model.get_input_embeddings(), "input")


def output_embeddings(model: PreTrainedModel) -> torch.Tensor:
    """``[V, d]``: the target's output (LM head) matrix."""
    return _weight(model.get_output_embeddings(), "output")


def model_fingerprint(model: PreTrainedModel) -> str:
    """Identity of a target for head files: its embedding shape and a hash of a few embedding rows."""
    emb = input_embeddings(model)
    rows = emb[: min(64, emb.shape[0])].detach().float().cpu().numpy().tobytes()
    return f"{tuple(emb.shape)}:{hashlib.sha256(rows).hexdigest()[:16]}"


class RecurrentDraftHead(nn.Module):
    """The draft head. ``embed`` and ``out_weight`` are the target's tensors (frozen, not saved)."""

    token_ids: torch.Tensor  # a buffer (saved with the weights)
    meta: dict[str, Any]  # what the trainer recorded (set by ``load``)

    def __init__(
        self,
        target: PreTrainedModel,
        kind: str = "shortlist",
        blocks: int = 2,
        shortlist: Sequence[int] | torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if kind not in HEAD_KINDS:
            raise ValueError(f"head kind must be one of {HEAD_KINDS}, got {kind!r}")
        emb, out = input_embeddings(target), output_embeddings(target)
        d, vocab = emb.shape[1], out.shape[0]
        self.kind, self.hidden_size, self.vocab_size, self.n_blocks = kind, d, vocab, blocks
        self.fingerprint = model_fingerprint(target)
        self._frozen = {"embed": emb.detach(), "out": out.detach()}  # plain dict: not parameters, not saved
        self.rnn_w = nn.Linear(d, d)
        self.rnn_u = nn.Linear(d, d, bias=False)
        linears = [nn.Linear(2 * d, 2 * d) for _ in range(blocks)]
        for block in linears:  # start as identity-ish residual blocks
            nn.init.zeros_(block.weight), nn.init.zeros_(block.bias)
        self.blocks = nn.ModuleList(linears)
        if kind == "full":
            self.proj = nn.Linear(2 * d, vocab)
        else:
            self.proj = nn.Linear(2 * d, d, bias=False)
            with torch.no_grad():  # start from the target's own head on h: logits ~ lm_head(h)
                self.proj.weight.zero_()
                self.proj.weight[:, :d] = torch.eye(d)
        ids = torch.arange(vocab) if shortlist is None else torch.as_tensor(shortlist, dtype=torch.long)
        if kind == "shortlist" and shortlist is None:
            raise ValueError("a shortlist head needs its token ids (the tokens the target writes most)")
        if kind != "shortlist":
            ids = torch.arange(vocab)
        if ids.numel() == 0 or int(ids.max()) >= vocab or int(ids.min()) < 0:
            raise ValueError(f"shortlist token ids must lie in [0, {vocab})")
        self.register_buffer("token_ids", ids, persistent=True)
        self.bias = nn.Parameter(torch.zeros(len(ids))) if kind == "shortlist" else None
        self.to(device=emb.device, dtype=emb.dtype)

    @property
    def out_size(self) -> int:
        """Width of the head's logits: the shortlist size or the vocabulary."""
        return int(self.token_ids.numel())

    def start(self, tokens: torch.Tensor) -> torch.Tensor:
        """First recurrent state from the guaranteed token ``[...]`` -> ``[..., d]``."""
        return F.silu(self.rnn_w(self._frozen["embed"][tokens]))

    def advance(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Next recurrent state after ``tokens``."""
        return F.silu(self.rnn_w(self._frozen["embed"][tokens]) + self.rnn_u(state))

    def logits(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``[..., out_size]`` logits over the head's tokens (``token_ids``) from ``[h; s]``."""
        x = torch.cat([hidden.expand_as(state), state], dim=-1)
        for block in self.blocks:
            x = x + F.silu(block(x))
        z: torch.Tensor = self.proj(x)
        if self.kind == "full":
            return z
        out = self._frozen["out"]
        if self.kind == "tied":
            return F.linear(z, out)
        if "short_out" not in self._frozen or self._frozen["short_out"].device != z.device:
            self._frozen["short_out"] = out[self.token_ids].contiguous()
        return F.linear(z, self._frozen["short_out"], self.bias)

    def full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Head logits scattered into the whole vocabulary (``-inf`` outside a shortlist)."""
        if self.kind != "shortlist":
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return (
            full.index_copy_(-1, self.token_ids, logits)
            if logits.dim() == 1
            else full.scatter_(-1, self.token_ids.expand_as(logits), logits)
        )

    # ---- files --------------------------------------------------------------------------------

    def save(self, path: str | Path, meta: dict[str, Any] | None = None) -> None:
        """Trainable weights + what identifies the target (written atomically)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = {
            "format": FORMAT,
            "kind": self.kind,
            "blocks": self.n_blocks,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "fingerprint": self.fingerprint,
            "meta": meta or {},
            "state": {k: v.detach().cpu() for k, v in self.state_dict().items()},
        }
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(blob, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path, target: PreTrainedModel, target_name: str = "the target") -> "RecurrentDraftHead":
        """A saved head bound to ``target``; refused when it was trained for another model or vocabulary."""
        path = Path(path)
        if not path.exists():
            raise ValueError(f"ReDrafter head not found: {path} (train one with `laser train-redrafter CONFIG`)")
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or blob.get("format") != FORMAT:
            raise ValueError(f"{path} is not a ReDrafter head file")
        check_head_matches(blob, target, target_name, path)
        head = cls(target, blob["kind"], blob["blocks"], blob["state"]["token_ids"])
        head.load_state_dict(blob["state"])
        head.meta = blob.get("meta", {})
        return head.eval().requires_grad_(False)


def check_head_matches(blob: dict[str, Any], target: PreTrainedModel, target_name: str, path: Path | str) -> None:
    """Refuse a head whose vocabulary, hidden size or embeddings differ from ``target``'s."""
    vocab = output_embeddings(target).shape[0]
    d = input_embeddings(target).shape[1]
    trained_for = blob.get("meta", {}).get("model", "another model")
    if blob["vocab_size"] != vocab or blob["hidden_size"] != d:
        raise ValueError(
            f"ReDrafter head {path} was trained for {trained_for!r} (vocabulary {blob['vocab_size']}, "
            f"hidden size {blob['hidden_size']}); {target_name} has vocabulary {vocab}, hidden size {d}"
        )
    if blob["fingerprint"] != model_fingerprint(target):
        raise ValueError(
            f"ReDrafter head {path} was trained for {trained_for!r}, whose token embeddings differ "
            f"from {target_name}'s: train a head for this model (`laser train-redrafter`)"
        )


# ---- beam search and dynamic tree attention ------------------------------------------------------


@dataclass
class Beams:
    """Beam-search drafts of R requests: ``tokens[r, i, 0]`` is request r's guaranteed token."""

    tokens: torch.Tensor  # [R, BW, L] vocabulary ids, best beam first
    scores: torch.Tensor  # [R, BW] cumulative draft log-probability
    logits: torch.Tensor | None = None  # [R, BW, L-1, out_size] head logits after positions 0..L-2


@torch.no_grad()
def beam_search(
    head: RecurrentDraftHead,
    hidden: torch.Tensor,
    roots: torch.Tensor,
    width: int,
    length: int,
    keep_logits: bool = False,
) -> Beams:
    """Beam search with the head alone, one head forward per position for all ``R`` requests.

    ``hidden`` ``[R, d]`` is the target's last hidden state, ``roots`` ``[R]`` the guaranteed tokens.
    Returns ``width`` beams of ``length`` tokens each (``length >= 2``).
    """
    r, k = roots.shape[0], head.out_size
    width = min(width, k)
    ids = head.token_ids
    state = head.start(roots)  # [R, d]
    logits = head.logits(hidden, state)  # [R, K]
    scores, idx = logits.float().log_softmax(-1).topk(width, dim=-1)  # [R, BW]
    tokens = torch.cat([roots[:, None, None].expand(r, width, 1), ids[idx][..., None]], dim=-1)  # [R, BW, 2]
    kept = [logits[:, None].expand(r, width, k)] if keep_logits else []
    state = state[:, None].expand(r, width, state.shape[-1])
    h = hidden[:, None]
    for _ in range(length - 2):
        state = head.advance(state, tokens[..., -1])  # [R, BW, d]
        step = head.logits(h, state)  # [R, BW, K]
        cand = (scores[..., None] + step.float().log_softmax(-1)).reshape(r, width * k)
        scores, flat = cand.topk(width, dim=-1)
        beam, tok = flat // k, flat % k

        def pick(t: torch.Tensor) -> torch.Tensor:  # the chosen beams' rows of a [R, BW, ...] tensor
            return t.gather(1, beam.view(r, width, *([1] * (t.dim() - 2))).expand(r, width, *t.shape[2:]))

        tokens = torch.cat([pick(tokens), ids[tok][..., None]], dim=-1)
        state = pick(state)
        if keep_logits:
            kept = [pick(x) for x in kept] + [pick(step)]
    out_logits = torch.stack(kept, dim=2) if keep_logits else None
    return Beams(tokens, scores, out_logits)


def prefix_tree(beams: torch.Tensor) -> torch.Tensor:
    """``[R, W, L]``: entry (r, i, k) is the smallest beam j sharing beam i's first k+1 tokens."""
    length = beams.shape[-1]
    eq = beams[:, :, None, :] == beams[:, None, :, :]  # [R, W, W, L]
    shared = eq.int().cumsum(-1) == torch.arange(1, length + 1, device=beams.device)
    return shared.int().argmax(dim=2)  # the first j of the maximum (True), i.e. the smallest


def dfs_order(tree: torch.Tensor) -> torch.Tensor:
    """``[R, W]`` beam order that makes row-major packing depth-first: sort beams by their prefix-tree
    rows (beams of one subtree become adjacent; siblings keep the order of their best beam)."""
    width, length = tree.shape[1], tree.shape[2]
    weights = width ** torch.arange(length - 1, -1, -1, device=tree.device, dtype=torch.long)
    return (tree.long() * weights).sum(-1).argsort(dim=-1, stable=True)


@dataclass
class Packed:
    """Beams packed by their shared prefixes (tensors over the batch of R requests)."""

    own: torch.Tensor  # [R, W, L] bool: (i, k) is a packed node (beam i is the first with that prefix)
    unpacker: torch.Tensor  # [R, W, L] packed index of every beam position
    parents: torch.Tensor  # [R, W, L] packed index of each position's parent (-1 at k = 0)
    sizes: torch.Tensor  # [R] packed nodes per request


def pack_beams(beams: torch.Tensor) -> Packed:
    """Deduplicate shared prefixes: packed nodes are the owned positions in row-major order."""
    r, w, length = beams.shape
    tree = prefix_tree(beams)
    own = tree == torch.arange(w, device=beams.device)[None, :, None]
    index = (own.reshape(r, -1).long().cumsum(-1) - 1).reshape(r, w, length)  # packed index of owned slots
    unpacker = index.gather(1, tree)  # (i, k) -> index of (tree[i, k], k)
    parents = torch.cat([torch.full_like(unpacker[..., :1], -1), unpacker[..., :-1]], dim=-1)
    return Packed(own, unpacker, parents, own.reshape(r, -1).sum(-1))


def beams_to_trees(
    beams: Beams,
    dedup: bool = True,
    budgets: Sequence[int | None] | None = None,
    dists: Sequence[torch.Tensor | None] | None = None,
) -> list[DraftTree]:
    """One :class:`DraftTree` per request: the packed beams (``dedup``) or root + one chain per beam.

    ``budgets[r]`` caps request r's draft nodes: the best beams that fit are kept (the best beam always
    fits when ``L - 1 <= budget``). ``dists[r]`` (``[BW, L-1, V]`` draft distributions) rides along as
    the tree's ``draft_dists`` for the paper's sampling rule.
    """
    r, w, length = beams.tokens.shape
    budgets = budgets or [None] * r
    tokens = beams.tokens
    if dedup:
        packed = pack_beams(tokens)
        per_beam = packed.own.sum(-1)  # [R, W] nodes each beam adds, in score order
    else:
        per_beam = torch.full((r, w), length - 1, dtype=torch.long)
        per_beam[:, 0] += 1
    fits = per_beam.cumsum(-1).cpu()
    trees = []
    for row in range(r):
        cap = budgets[row]
        keep = w if cap is None else max(1, int((fits[row] <= cap + 1).sum()))
        beam_tokens = tokens[row, :keep]
        dist = None if dists is None else dists[row]
        dist = None if dist is None else dist[:keep]
        trees.append(_packed_tree(beam_tokens, dist) if dedup else _chains_tree(beam_tokens, dist))
    return trees


def _packed_tree(beams: torch.Tensor, dists: torch.Tensor | None) -> DraftTree:
    """Depth-first packed tree of one request's beams ``[W, L]``."""
    order = dfs_order(prefix_tree(beams[None]))[0]
    beams = beams[order]
    packed = pack_beams(beams[None])
    own = packed.own[0]
    tokens = beams[own].cpu().numpy()
    parents = packed.parents[0][own].cpu().numpy()
    draft_dists = None
    if dists is not None:  # row of node (i, k) = distribution after it; leaves (k = L-1) get zeros
        dists = dists[order]
        rows = torch.cat([dists, dists.new_zeros(dists.shape[0], 1, dists.shape[-1])], dim=1)  # [W, L, V]
        draft_dists = rows[own]
    return DraftTree(tokens, parents, draft_dists=draft_dists)


def _chains_tree(beams: torch.Tensor, dists: torch.Tensor | None) -> DraftTree:
    """No deduplication: the root, then every beam's drafts as its own chain (duplicates kept)."""
    w, length = beams.shape
    tokens = np.concatenate([[int(beams[0, 0])], beams[:, 1:].reshape(-1).cpu().numpy()])
    starts = 1 + np.arange(w) * (length - 1)
    parents = np.arange(-1, len(tokens) - 1)
    parents[starts] = 0
    draft_dists = None
    if dists is not None:
        zero = dists.new_zeros(1, dists.shape[-1])
        rows = [dists[0, 0][None]] + [torch.cat([dists[i, 1:], zero]) for i in range(w)]
        draft_dists = torch.cat(rows)
    return DraftTree(tokens, parents, draft_dists=draft_dists)


# ---- the drafter ----------------------------------------------------------------------------------


class ReDrafter(Drafter):
    """Per-request state: the target's last hidden state (after prefill: at the last cached prompt token).
    Without one the step drafts nothing."""

    needs_hidden = True

    def __init__(
        self,
        head: RecurrentDraftHead,
        beam_width: int,
        beam_length: int,
        dedup: bool = True,
        sampling: SamplingParams = GREEDY,
        paper_sampling: bool = False,
    ):
        if beam_width < 1 or beam_length < 2:
            raise ValueError(f"beam_width must be >= 1 and beam_length >= 2, got {beam_width}, {beam_length}")
        self.head, self.width, self.length, self.dedup = head, beam_width, beam_length, dedup
        self.sampling = sampling
        self.with_dists = paper_sampling and not sampling.greedy  # q only where the paper rule reads it
        self.hidden: torch.Tensor | None = None

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        return self.propose_batch([self], [context], [budget])[0]

    @classmethod
    @torch.no_grad()
    def propose_batch(
        cls, drafters: Sequence["ReDrafter"], contexts: Sequence[Sequence[int]], budgets: Sequence[int | None]
    ) -> list[DraftTree]:
        """Trees for all requests; requests sharing a head and beam shape search in one head forward per
        position (the engine groups drafters by class; heads and shapes are grouped here)."""
        trees: dict[int, DraftTree] = {}
        groups: dict[tuple[int, int, int, bool, bool], list[tuple[int, torch.Tensor]]] = {}
        for i, (d, ctx, budget) in enumerate(zip(drafters, contexts, budgets)):
            length = d.length if budget is None else min(d.length, budget + 1)
            if d.hidden is None or length < 2:
                trees[i] = DraftTree.chain(ctx[-1])
            else:
                groups.setdefault((id(d.head), d.width, length, d.dedup, d.with_dists), []).append((i, d.hidden))
        for (_, width, length, dedup, with_dists), members in groups.items():
            rows = [i for i, _ in members]
            head = drafters[rows[0]].head
            hidden = torch.stack([h for _, h in members]).to(head.rnn_w.weight.dtype)
            roots = torch.tensor([contexts[i][-1] for i in rows], device=hidden.device)
            beams = beam_search(head, hidden, roots, width, length, keep_logits=with_dists)
            dists: list[torch.Tensor | None] | None = None
            if with_dists and beams.logits is not None:  # kept whenever with_dists
                dists = [
                    target_probs(head.full_vocab(beams.logits[j]), drafters[i].sampling) for j, i in enumerate(rows)
                ]
            for i, tree in zip(rows, beams_to_trees(beams, dedup, [budgets[i] for i in rows], dists)):
                trees[i] = tree
        return [trees[i] for i in range(len(drafters))]

    def commit(self, new_tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        self.hidden = hidden

    def close(self) -> None:
        self.hidden = None


# ---- the paper's sampling rule --------------------------------------------------------------------


class PaperSamplingVerifier(Verifier):
    """ReDrafter's sampling rule: along every beam (root-to-leaf path) accept draft x at node j iff
    ``u < p_j(x) / q_j(x)`` (fresh u per beam and position), keep the beam with the longest accepted
    prefix (first on ties), then sample from ``norm(relu(p - q))`` where it stopped, or from p after a
    fully accepted beam. Not provably exact. Greedy rows (temperature 0) use greedy verification."""

    def __init__(self) -> None:
        self._greedy = TopKVerifier(1)

    def verify(self, logits: torch.Tensor, batch: TreeBatch, requests: Sequence[Request]) -> list[Outcome]:
        greedy = self._greedy.verify(logits, batch) if any(r.sampling.greedy for r in requests) else None
        out = []
        for b, req in enumerate(requests):
            if greedy is not None and req.sampling.greedy:  # greedy is None only when no row is greedy
                out.append(greedy[b])
                continue
            tree = batch.trees[b]
            probs = target_probs(logits[b, : len(tree)], req.sampling).cpu()
            out.append(self.verify_tree(tree, probs, req.generator))
        return out

    def verify_tree(self, tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Outcome:
        if len(tree) == 1 or tree.draft_dists is None:
            token = sample(probs[0], generator)
            return Outcome([0], [token])
        q = tree.draft_dists.float().cpu()
        has_child = np.zeros(len(tree), dtype=bool)
        has_child[tree.parents[1:]] = True
        best_path, best_n = [0], -1
        for leaf in np.flatnonzero(~has_child):
            path = tree.path_to(int(leaf))
            n = 0
            for parent, node in zip(path[:-1], path[1:]):
                x = int(tree.tokens[node])
                if float(torch.rand((), generator=generator)) * float(q[parent, x]) >= float(probs[parent, x]):
                    break
                n += 1
            if n > best_n:
                best_path, best_n = path, n
        path = best_path[: best_n + 1]
        stop = path[-1]
        p = probs[stop]
        if best_n < len(best_path) - 1:  # stopped on a rejection: the residual of the target and the head
            residual = torch.clamp(p - q[stop], min=0.0)
            p = residual / residual.sum() if residual.sum() > 0 else p
        return Outcome(path, [int(t) for t in tree.tokens[path[1:]]] + [sample(p, generator)])
