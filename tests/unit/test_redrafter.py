"""ReDrafter: prefix deduplication, packing, beam search, the drafter in the engine, greedy losslessness,
sampling rules and head files (tiny random Llama models; no download)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import laser
from laser.decoders.redrafter.head import (
    PaperSamplingVerifier,
    ReDrafter,
    RecurrentDraftHead,
    beam_search,
    beams_to_trees,
    pack_beams,
    prefix_tree,
)
from laser.testing import first_divergence
from laser.tree import DraftTree, pack_trees
from tests.helpers import greedy_reference, random_prompts

MAX_NEW = 40


def _random_beams(seed: int, r: int = 3, w: int = 6, length: int = 5, vocab: int = 3) -> torch.Tensor:
    """Beams with many shared prefixes (tiny vocabulary), all starting at the same root per request."""
    g = torch.Generator().manual_seed(seed)
    beams = torch.randint(0, vocab, (r, w, length), generator=g)
    beams[:, :, 0] = torch.arange(r)[:, None] + 10
    return beams


@pytest.fixture(scope="module")
def head(tiny_lm):
    """An untrained tied head with perturbed weights: agrees with the target sometimes, not always."""
    torch.manual_seed(0)
    h = RecurrentDraftHead(tiny_lm.model, "tied")
    with torch.no_grad():
        for block in h.blocks:
            block.weight.normal_(0, 0.05)
    return h


def test_prefix_tree_of_the_notes_example():
    beams = torch.tensor([[[91, 92, 93, 95], [91, 92, 94, 96], [91, 92, 93, 97]]])
    assert prefix_tree(beams).tolist() == [[[0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 2]]]


@pytest.mark.parametrize("seed", range(5))
def test_prefix_tree_invariants(seed):
    beams = _random_beams(seed)
    pt = prefix_tree(beams)
    r, w, length = beams.shape
    for b, i, k in itertools.product(range(r), range(w), range(length)):
        j = int(pt[b, i, k])
        assert j <= i
        assert beams[b, i, : k + 1].tolist() == beams[b, j, : k + 1].tolist()
        assert all(beams[b, m, : k + 1].tolist() != beams[b, i, : k + 1].tolist() for m in range(j)), "not minimal"


@pytest.mark.parametrize("seed", range(5))
def test_packed_unpacker_gives_back_the_beams(seed):
    beams = _random_beams(seed)
    packed = pack_beams(beams)
    r, w, length = beams.shape
    for b in range(r):
        flat = beams[b][packed.own[b]]  # packed tokens, row-major
        assert torch.equal(flat[packed.unpacker[b]], beams[b])
        assert length <= len(flat) <= 1 + w * (length - 1)
        assert int(packed.sizes[b]) == len(flat)
        # each position's parent is the packed node of its prefix one shorter
        for i, k in itertools.product(range(w), range(1, length)):
            assert packed.parents[b, i, k] == packed.unpacker[b, i, k - 1]


@pytest.mark.parametrize("seed", range(5))
def test_packed_tree_is_depth_first_and_holds_every_beam(seed):
    beams = _random_beams(seed)
    for b, tree in enumerate(beams_to_trees(laser.decoders.redrafter.head.Beams(beams, torch.zeros(beams.shape[:2])))):
        # depth-first: every subtree is a contiguous block starting at its root
        for node in range(len(tree)):
            sub = [m for m in range(len(tree)) if node in tree.path_to(m)]
            assert sub == list(range(node, node + len(sub)))
        paths = {tuple(tree.tokens[tree.path_to(m)].tolist()) for m in range(len(tree))}
        for beam in beams[b].tolist():
            assert tuple(beam) in paths


def test_budget_keeps_the_best_beams_that_fit():
    beams = torch.tensor([[[9, 1, 2, 3], [9, 1, 2, 4], [9, 5, 6, 7]]])
    b = laser.decoders.redrafter.head.Beams(beams, torch.zeros(1, 3))
    assert len(beams_to_trees(b)[0]) == 8
    assert len(beams_to_trees(b, budgets=[4])[0]) == 5  # root + 1,2,3 + 4; beam 2 would need 3 more
    assert len(beams_to_trees(b, budgets=[3])[0]) == 4
    assert len(beams_to_trees(b, dedup=False)[0]) == 10


def test_packed_tree_masked_logits_equal_per_beam_logits(tiny_lm, head):
    model = tiny_lm.model
    context = [5, 17, 33, 8, 21, 40]
    h = model(torch.tensor([context[:-1]], device=model.device), output_hidden_states=True).hidden_states[-1][0, -1]
    beams = beam_search(head, h[None], torch.tensor([context[-1]], device=model.device), 4, 4)
    tree = beams_to_trees(beams)[0]
    cache = DynamicCache()
    model(torch.tensor([context[:-1]], device=model.device), past_key_values=cache, use_cache=True)
    n = len(context) - 1
    batch = pack_trees([tree], [n], n, torch.float32, model.device)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        past_key_values=cache,
    ).logits[0]
    packed = pack_beams(beams.tokens)
    order = laser.decoders.redrafter.head.dfs_order(prefix_tree(beams.tokens))[0]
    ordered = beams.tokens[0, order]
    unpacker = pack_beams(ordered[None]).unpacker[0]
    for i, beam in enumerate(ordered.tolist()):
        want = model(torch.tensor([context[:-1] + beam], device=model.device)).logits[0, -len(beam) :]
        torch.testing.assert_close(logits[unpacker[i]], want, atol=1e-4, rtol=1e-4)
    assert packed.sizes[0] == len(tree)


def test_beam_width_1_is_greedy_drafting(tiny_lm, head):
    torch.manual_seed(1)
    device = tiny_lm.model.device
    hidden = torch.randn(3, tiny_lm.model.config.hidden_size, device=device)
    roots = torch.tensor([4, 50, 77], device=device)
    beams = beam_search(head, hidden, roots, 1, 6).tokens[:, 0]
    with torch.no_grad():
        state, tokens = head.start(roots), [roots]
        for _ in range(5):
            tokens.append(head.logits(hidden, state).argmax(-1))
            state = head.advance(state, tokens[-1])
    assert torch.equal(beams, torch.stack(tokens, dim=1))


def test_beams_are_distinct_and_best_first(tiny_lm, head):
    device = tiny_lm.model.device
    hidden = torch.randn(2, tiny_lm.model.config.hidden_size, device=device)
    beams = beam_search(head, hidden, torch.tensor([3, 9], device=device), 8, 5)
    assert torch.all(beams.scores[:, :-1] >= beams.scores[:, 1:])
    for row in beams.tokens.tolist():
        assert len({tuple(b) for b in row}) == len(row)


class _Recorder(ReDrafter):
    """Checks, per step, that the cache holds the context but its last token and grew by the tokens appended."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.request = None
        self.steps: list[tuple[int, int, int]] = []  # (cache_len at propose, tokens appended, drafts)
        self.budget_seen: list[int | None] = []

    @classmethod
    def propose_batch(cls, drafters, contexts, budgets):
        trees = super().propose_batch(drafters, contexts, budgets)
        for d, ctx, tree in zip(drafters, contexts, trees):
            assert d.request.cache_len == len(ctx) - 1
            d.steps.append([d.request.cache_len, None, len(tree) - 1])
        return trees

    def commit(self, new_tokens, hidden=None):
        if not self.steps:  # after prefill: the target's state at the last cached prompt token, no tokens
            assert list(new_tokens) == []
        else:
            self.steps[-1][1] = len(new_tokens)
        assert hidden is not None and hidden.shape == (self.head.hidden_size,)
        super().commit(new_tokens, hidden)


@pytest.mark.parametrize("width, length", [(1, 2), (2, 4), (4, 3), (8, 5)])
def test_tokens_per_step_and_cache_growth(tiny_lm, head, width, length):
    from laser.engine import Request, TreeDecodingEngine
    from laser.verify import RejectionSampler

    engine = TreeDecodingEngine(tiny_lm.model, RejectionSampler(), tiny_lm.eos_ids)
    reqs = []
    for p in random_prompts(4, 96, seed=2):
        d = _Recorder(head, width, length)
        reqs.append(Request(tokens=list(p), prompt_len=len(p), drafter=d, max_new_tokens=MAX_NEW))
        d.request = reqs[-1]
    engine.run(reqs)
    for r in reqs:
        steps = r.drafter.steps
        assert steps[0][2] > 0, "the prefill's hidden state lets the first step draft"
        assert all(drafts <= width * (length - 1) for _, _, drafts in steps)
        for (c0, appended, _), (c1, _, _) in zip(steps, steps[1:]):
            assert c1 - c0 == appended  # the cache grows by n + 1
        assert all(1 <= a + 1 <= length for a in r.stats.accepted_per_step)  # tokens per step


def test_budget_is_honoured(tiny_lm, head):
    d = ReDrafter(head, 4, 5)
    d.commit([7], torch.randn(tiny_lm.model.config.hidden_size, device=tiny_lm.model.device))
    assert len(d.propose([3, 4, 7], budget=0)) == 1
    assert len(d.propose([3, 4, 7], budget=2)) <= 3
    assert len(d.propose([3, 4, 7], budget=6)) <= 7
    assert len(d.propose([3, 4, 7])) <= 1 + 4 * 4


def _check_equal(lm, prompts, refs, outs):
    for prompt, ref, out in zip(prompts, refs, outs):
        assert out.token_ids == ref, f"prompt {prompt}: {first_divergence(lm, prompt, out.token_ids, ref)}"
    accepted = sum(sum(o.stats.accepted_per_step) for o in outs)
    drafted = sum(sum(o.stats.drafted_per_step) for o in outs)
    assert 0 < accepted < drafted, "the test needs partial acceptance"


@pytest.fixture(scope="module")
def greedy_case(tiny_lm):
    prompts = random_prompts(8, tiny_lm.model.config.vocab_size, seed=13)
    return prompts, [greedy_reference(tiny_lm, p, MAX_NEW) for p in prompts]


@pytest.mark.parametrize(
    "width, length, dedup",
    [
        (2, 4, True),
        *[
            pytest.param(*case, marks=pytest.mark.slow)
            for case in [(1, 3, True), (4, 5, True), (8, 3, True), (4, 4, False)]
        ],
    ],
)
def test_greedy_equals_generate_at_batch_1_and_8(tiny_lm, head, greedy_case, width, length, dedup):
    prompts, refs = greedy_case
    dec = laser.get_decoder("redrafter", tiny_lm, head=head, beam_width=width, beam_length=length, dedup=dedup)
    _check_equal(tiny_lm, prompts, refs, [dec.generate(p, MAX_NEW) for p in prompts])
    _check_equal(tiny_lm, prompts, refs, dec.generate_batch(prompts, MAX_NEW))


def test_batched_proposals_equal_one_by_one(tiny_lm, head):
    torch.manual_seed(4)
    drafters = [ReDrafter(head, 4, 4) for _ in range(3)]
    contexts = [[5, 6, 7], [9, 10], [30, 31, 32, 33]]
    for d in drafters:
        d.commit([1], torch.randn(tiny_lm.model.config.hidden_size, device=tiny_lm.model.device))
    together = ReDrafter.propose_batch(drafters, contexts, [None, 5, None])
    alone = [d.propose(c, b) for d, c, b in zip(drafters, contexts, [None, 5, None])]
    for a, b in zip(together, alone):
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()


def test_paper_rule_on_one_beam_samples_the_target():
    """With one beam of one draft drawn from q, the paper's rule is standard speculative sampling: exact."""
    p = torch.tensor([0.2, 0.3, 0.5])
    q = torch.tensor([0.5, 0.3, 0.2])
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(3)
    verifier = PaperSamplingVerifier()
    n = 6000
    for _ in range(n):
        x = int(torch.multinomial(q, 1, generator=g))
        tree = DraftTree(np.array([0, x]), np.array([-1, 0]), draft_dists=torch.stack([q, torch.zeros(3)]))
        probs = torch.stack([p, torch.tensor([1.0, 0.0, 0.0])])
        out = verifier.verify_tree(tree, probs, g)
        counts[out.tokens[0]] += 1
    expected = p.numpy() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 13.8, f"chi-square {chi2:.1f} (2 dof, p=0.001): {counts}"


@pytest.mark.parametrize("rule", ["exact", "paper"])
def test_sampling_runs_and_is_reproducible(tiny_lm, head, rule):
    dec = laser.get_decoder("redrafter", tiny_lm, head=head, beam_width=3, beam_length=4, sampling_rule=rule)
    sampling = laser.SamplingParams(temperature=0.8, seed=5)
    prompts = random_prompts(3, 96, seed=8)
    a = dec.generate_batch(prompts, 24, sampling=sampling)
    b = dec.generate_batch(prompts, 24, sampling=sampling)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert all(0 < len(x.token_ids) <= 24 for x in a)
    assert sum(sum(x.stats.accepted_per_step) for x in a) > 0


def test_head_file_round_trip_and_refusals(tiny_lm, head, tmp_path):
    path = tmp_path / "h.pt"
    head.save(path, {"model": tiny_lm.name})
    loaded = RecurrentDraftHead.load(path, tiny_lm.model)
    h, s = (torch.randn(2, head.hidden_size, device=tiny_lm.model.device) for _ in range(2))
    torch.testing.assert_close(loaded.logits(h, s), head.logits(h, s))
    other_vocab = laser.tiny_llama(vocab_size=120, seed=3)
    with pytest.raises(ValueError, match="trained for 'tiny-llama-3'.*vocabulary 96"):
        RecurrentDraftHead.load(path, other_vocab.model)
    other_model = laser.tiny_llama(seed=4)
    with pytest.raises(ValueError, match="token embeddings differ"):
        laser.get_decoder("redrafter", other_model, head=str(path))
    with pytest.raises(ValueError, match="not found"):
        laser.get_decoder("redrafter", tiny_lm, head=str(tmp_path / "missing.pt"))


def test_decoder_parameters_are_checked(tiny_lm, head):
    with pytest.raises(ValueError, match="needs decoder.params.head"):
        laser.get_decoder("redrafter", tiny_lm)
    with pytest.raises(ValueError, match="beam_length"):
        laser.get_decoder("redrafter", tiny_lm, head=head, beam_length=1)
    with pytest.raises(ValueError, match="sampling_rule"):
        laser.get_decoder("redrafter", tiny_lm, head=head, sampling_rule="fast")
    dec = laser.get_decoder("redrafter", tiny_lm, head=head, beam_width=3, beam_length=5)
    assert dec.params()["beam_width"] == 3 and dec.params()["beam_length"] == 5
    assert "redrafter" in laser.available_decoders()
