"""The engine's contract with drafters and models: identity of requests, where generation stops, the
attention-backend guard, hidden states for drafters that ask, batched proposals and draft budgets."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Sequence

import pytest
import torch

import laser
from laser.engine import Request, TreeDecodingEngine
from laser.verify import TopKVerifier
from pools import RetrievalPool
from tests.helpers import greedy_reference, random_prompts


def test_requests_compare_by_identity():
    a = Request(tokens=[1, 2], prompt_len=2, drafter=laser.NoDrafter(), max_new_tokens=4)
    b = copy.copy(a)
    assert a != b and a == a  # equal contents, two requests: the engine must tell them apart


def test_identical_requests_with_different_budgets_finish_separately(tiny_lm):
    shared = laser.NoDrafter()  # a stateless drafter may be shared
    reqs = [Request(tokens=[5, 6, 7], prompt_len=3, drafter=shared, max_new_tokens=n) for n in (2, 6)]
    engine = TreeDecodingEngine(tiny_lm.model, TopKVerifier(1), set())
    engine.run(reqs)
    ref = greedy_reference(tiny_lm, [5, 6, 7], 6)
    assert [r.new_tokens for r in reqs] == [ref[:2], ref]
    assert engine.log.decode_tokens == 8 and engine.log.decode_s > 0  # the decoding steps' tokens and time


def test_a_request_halted_by_its_check_ends_with_the_checks_reason(tiny_lm):
    seen: list[int] = []

    def halt(new: list[int]) -> tuple[str, int] | None:
        seen.append(len(new))
        return ("halted", 2) if len(new) >= 3 else None

    reqs = [
        Request(tokens=[5, 6, 7], prompt_len=3, drafter=laser.NoDrafter(), max_new_tokens=8, halt=h)
        for h in (halt, None)
    ]
    TreeDecodingEngine(tiny_lm.model, TopKVerifier(1), set()).run(reqs)
    ref = greedy_reference(tiny_lm, [5, 6, 7], 8)
    assert [r.new_tokens for r in reqs] == [ref[:2], ref]  # kept as the check said; the other row untouched
    assert [r.stats.finish_reason for r in reqs] == ["halted", "length"] and seen == [1, 2, 3]


def test_stops_where_generate_stops_not_at_the_tokenizers_eos(tiny_lm):
    prompt = random_prompts(1, 96, seed=4)[0]
    ref = greedy_reference(tiny_lm, prompt, 30)
    tok_eos = ref[5]  # a token generate emits mid-text; the tokenizer (only) calls it EOS
    lm = laser.LoadedModel(tiny_lm.model, SimpleNamespace(eos_token_id=tok_eos, decode=lambda *a, **k: ""), "t")
    assert tok_eos not in lm.eos_ids and lm.eos_ids == {tiny_lm.model.generation_config.eos_token_id}
    out = laser.get_decoder("autoregressive", lm).generate(prompt, 30)
    assert out.token_ids == ref


def test_backends_that_ignore_tree_masks_are_refused():
    lm = laser.tiny_llama(seed=9)
    lm.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2.*ignores custom 4D tree masks"):
        laser.get_decoder("laser", lm)


class RecordingDrafter(laser.Drafter):
    """Drafts nothing; records what the engine hands it."""

    needs_hidden = True
    batches: list[int] = []

    def __init__(self):
        self.seen: list[tuple[list[int], torch.Tensor | None]] = []
        self.contexts: list[list[int]] = []

    @classmethod
    def propose_batch(cls, drafters, contexts, budgets):
        cls.batches.append(len(drafters))
        for d, c in zip(drafters, contexts):
            d.contexts.append(list(c))
        return super().propose_batch(drafters, contexts, budgets)

    def commit(self, new_tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        self.seen.append((list(new_tokens), hidden))


def test_hidden_state_reaches_drafters_that_ask_and_proposals_are_batched(tiny_lm):
    RecordingDrafter.batches = []
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    drafters = [RecordingDrafter(), RecordingDrafter()]
    reqs = [Request(tokens=list(p), prompt_len=len(p), drafter=d, max_new_tokens=4) for p, d in zip(prompts, drafters)]
    TreeDecodingEngine(tiny_lm.model, TopKVerifier(1), set()).run(reqs)
    assert RecordingDrafter.batches == [2, 2, 2, 2]  # one call per step for the whole batch
    for prompt, d in zip(prompts, drafters):
        context = d.contexts[-1]  # prompt + 3 generated tokens; the last one is the next root
        with torch.no_grad():
            want = tiny_lm.model(
                torch.tensor([context], device=tiny_lm.model.device), output_hidden_states=True
            ).hidden_states[-1][0]
        # after prefill: the last cached prompt token's state (it predicts the first root), no new tokens
        (first_new, first_hidden), steps = d.seen[0], d.seen[1:]
        assert first_new == [] and torch.allclose(first_hidden, want[len(prompt) - 2], atol=1e-4)
        # after each step: the hidden state at the accepted position, i.e. the one that predicted the new token
        for step, (new, hidden) in enumerate(steps):
            pos = len(prompt) - 1 + step
            assert torch.allclose(hidden, want[pos], atol=1e-4)
        assert len(steps) == 3  # the step that finishes the request commits nothing


def test_no_hidden_states_for_drafters_that_do_not_ask(tiny_lm, monkeypatch):
    calls = []
    forward = tiny_lm.model.forward
    monkeypatch.setattr(
        tiny_lm.model, "forward", lambda *a, **k: calls.append(k.get("output_hidden_states")) or forward(*a, **k)
    )
    laser.get_decoder("autoregressive", tiny_lm).generate([5, 6, 7], 3)
    assert calls[1:] == [False, False, False]  # decoding forwards; the first one is the prefill


def test_budget_caps_trie_drafts(tiny_lm):
    prompt = random_prompts(1, 96, seed=8)[0]
    ref = greedy_reference(tiny_lm, prompt, 24)
    pool = RetrievalPool.from_token_ids([ref] * 3)
    sizes = []

    class Spy(laser.Drafter):
        def __init__(self):
            self.inner = pool.open(prompt, max_nodes=32, n_max=8, min_prob=0.0)

        def propose(self, context, budget=None):
            tree = self.inner.propose(context, budget)
            sizes.append(len(tree) - 1)
            return tree

        def commit(self, new_tokens, hidden=None):
            self.inner.commit(new_tokens)

    req = Request(tokens=list(prompt), prompt_len=len(prompt), drafter=Spy(), max_new_tokens=24, budget=3)
    TreeDecodingEngine(tiny_lm.model, TopKVerifier(1), set()).run([req])
    assert req.new_tokens == ref and max(sizes) == 3


class BeamState(laser.Drafter):
    """Lays the current beams out as one tree under the root (shared prefixes merged)."""

    def __init__(self, state: dict):
        self.state = state

    def propose(self, context, budget=None):
        beams = self.state.get("beams", [((), 0.0)])
        nodes: dict[tuple[int, ...], int] = {(): 0}
        tokens, parents, scores = [context[-1]], [-1], [0.0]
        for seq, score in sorted(beams):  # sorted: parents are laid out before children
            for d in range(1, len(seq) + 1):
                if seq[:d] not in nodes:
                    nodes[seq[:d]] = len(tokens)
                    tokens.append(seq[d - 1]), parents.append(nodes[seq[: d - 1]]), scores.append(0.0)
            scores[nodes[seq]] = score
        self.state["nodes"] = nodes
        import numpy as np

        return laser.DraftTree(np.array(tokens), np.array(parents), scores=np.array(scores))


class PlainBeamSearch(laser.BeamVerifier):
    """Beam search of width W over L tokens through the hook: no KV kept, beams re-laid every step."""

    def __init__(self, width: int, length: int):
        self.width, self.length = width, length

    def verify_beams(self, tree, log_probs, request):
        from laser.verify import expand_beams

        state = request.state
        beams = state.get("beams", [((), 0.0)])
        ends = [state["nodes"][seq] for seq, _ in beams]
        by_node = {state["nodes"][seq]: seq for seq, _ in beams}
        state["beams"] = [(by_node[n] + (t,), s) for n, t, s in expand_beams(tree, log_probs, ends, self.width)]
        if len(state["beams"][0][0]) == self.length:
            return laser.Outcome(path=[], tokens=list(state["beams"][0][0]), finished=True)
        return laser.Outcome(path=[], tokens=[])


def test_beam_hook_runs_plain_beam_search_like_generate(tiny_lm):
    prompt, width, length = [5, 6, 7, 8], 3, 4
    model = copy.deepcopy(tiny_lm.model)
    model.generation_config.eos_token_id = None  # fixed length: beam scores compare as plain sums
    ref = model.generate(
        torch.tensor([prompt]),
        num_beams=width,
        max_new_tokens=length,
        do_sample=False,
        length_penalty=0.0,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    state: dict = {}
    req = Request(
        tokens=list(prompt), prompt_len=len(prompt), drafter=BeamState(state), max_new_tokens=length, state=state
    )
    TreeDecodingEngine(model, PlainBeamSearch(width, length), set()).run([req])
    assert req.new_tokens == ref[0, len(prompt) :].tolist()
    assert req.stats.target_forwards == length and req.cache_len == len(prompt) - 1  # nothing kept past the prompt
