"""Tree attention: every node's logits equal a sequential forward of prefix + its path; KV compaction
leaves exactly the cache of the accepted sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from laser import DraftTree
from transformers.cache_utils import DynamicCache

from laser.kv_cache import SlotKVCache
from laser.engine import Request, TreeDecodingEngine
from laser.drafting import NoDrafter
from laser.tree import pack_trees
from laser.verify import TopKVerifier


def random_tree(rng: np.random.Generator, n: int, vocab: int) -> DraftTree:
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    return DraftTree(rng.integers(2, vocab, n), parents)


def sequential_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids], device=model.device)).logits[0, -1]


def prefill(model, prompts: list[list[int]]) -> tuple[SlotKVCache, list[Request]]:
    engine = TreeDecodingEngine(model, TopKVerifier(), eos_ids=set())
    seqs = [Request(tokens=list(p), prompt_len=len(p), drafter=NoDrafter(), max_new_tokens=1) for p in prompts]
    batch = engine.batch(len(prompts), capacity=4)  # smaller than the prompts: the buffers must grow
    batch.add(seqs)
    batch._compact()  # the cache sized to the rows, as before a step
    assert batch.active == seqs
    return batch.cache, seqs


@torch.inference_mode()
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_logits_equal_sequential_forwards_in_a_padded_batch(tiny_lm, seed):
    rng = np.random.default_rng(seed)
    model, vocab = tiny_lm.model, tiny_lm.model.config.vocab_size
    prompts = [rng.integers(2, vocab, int(rng.integers(3, 15))).tolist() for _ in range(3)]
    trees = [random_tree(rng, int(rng.integers(1, 12)), vocab) for _ in prompts]
    trees = [DraftTree(np.r_[p[-1], t.tokens[1:]], t.parents) for p, t in zip(prompts, trees)]  # root = last token
    cache, seqs = prefill(model, prompts)
    batch = pack_trees(trees, [s.cache_len for s in seqs], cache.used, torch.float32, model.device)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        past_key_values=cache,
        use_cache=True,
    ).logits
    for b, (prompt, tree) in enumerate(zip(prompts, trees)):
        for node in range(len(tree)):
            path = tree.tokens[tree.path_to(node)].tolist()
            ref = sequential_logits(model, prompt[:-1] + path)
            torch.testing.assert_close(logits[b, node], ref, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_kv_cache_after_compaction_equals_recomputed_cache(tiny_lm):
    model = tiny_lm.model
    prompts = [[5, 9, 14, 22, 7], [40, 41, 42]]
    trees = [
        DraftTree([7, 30, 31, 50, 51, 52], [-1, 0, 1, 0, 3, 4]),  # accept the second branch: a gather
        DraftTree([42, 60, 61], [-1, 0, 1]),
    ]  # accept the DFS prefix: truncation only
    paths = [[0, 3, 4], [0, 1]]
    cache, seqs = prefill(model, prompts)
    offset = cache.used
    batch = pack_trees(trees, [s.cache_len for s in seqs], offset, torch.float32, model.device)
    model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        past_key_values=cache,
        use_cache=True,
    )
    cache.keep_slots([s.cache_len for s in seqs], [[offset + n for n in path] for path in paths])
    for b, (prompt, tree, path) in enumerate(zip(prompts, trees, paths)):
        accepted = prompt[:-1] + tree.tokens[path].tolist()
        ref = DynamicCache()
        model(torch.tensor([accepted], device=model.device), past_key_values=ref, use_cache=True)
        for layer, ref_layer in zip(cache.layers, ref.layers):
            torch.testing.assert_close(layer.keys[b, :, : len(accepted)], ref_layer.keys[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(layer.values[b, :, : len(accepted)], ref_layer.values[0], atol=1e-5, rtol=1e-5)
    assert cache.used == max(len(p) - 1 + len(path) for p, path in zip(prompts, paths))


def test_draft_tree_layout_and_validation():
    tree = DraftTree([7, 1, 2, 3, 4], [-1, 0, 1, 0, 3])
    assert tree.depth.tolist() == [0, 1, 2, 1, 2]
    assert tree.path_to(4) == [0, 3, 4]
    anc = tree.ancestor_mask()
    assert anc[4].tolist() == [True, False, False, True, True]
    assert DraftTree.chain(7, [1, 2]).parents.tolist() == [-1, 0, 1]
    with pytest.raises(ValueError, match="earlier node"):
        DraftTree([1, 2, 3], [-1, 2, 0])
    batch = pack_trees([tree, DraftTree.chain(9)], [4, 2], 5, torch.float32, "cpu")
    assert batch.position_ids.tolist() == [[4, 5, 6, 5, 6], [2, 2, 2, 2, 2]]
    seen = batch.attention_mask[:, 0] == 0
    assert seen[0, 4].tolist() == [True] * 4 + [False] + [True, False, False, True, True]
    assert seen[1, 0].tolist() == [True, True, False, False, False] + [True, False, False, False, False]


@torch.inference_mode()
@pytest.mark.parametrize("seed", [0, 1])
def test_kept_subtree_stays_cached_and_later_nodes_see_it(tiny_lm, seed):
    """Step 1 feeds a whole tree and keeps a subtree (not a path: beam prefixes); step 2 lays that subtree
    out as cached nodes, feeds only new children, and their logits equal sequential forwards."""
    from laser.engine import kept_slots, subtree
    from laser.verify import Outcome

    rng = np.random.default_rng(seed)
    model, vocab = tiny_lm.model, tiny_lm.model.config.vocab_size
    prompts = [rng.integers(2, vocab, int(rng.integers(3, 9))).tolist() for _ in range(2)]
    first = [DraftTree([p[-1], 11, 12, 13, 14, 15], [-1, 0, 1, 0, 3, 0]) for p in prompts]
    keeps = [[0, 1, 3, 4], [0, 3, 5]]  # two branches kept, the rest dropped
    cache, seqs = prefill(model, prompts)
    offset = cache.used
    batch = pack_trees(first, [s.cache_len for s in seqs], offset, torch.float32, model.device)
    model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        past_key_values=cache,
        use_cache=True,
    )
    outcomes = [Outcome([], [], keep=k) for k in keeps]
    cache.keep_slots(
        [s.cache_len for s in seqs], [kept_slots(s, t, o, offset) for s, t, o in zip(seqs, first, outcomes)]
    )
    for s, t, k in zip(seqs, first, keeps):
        s.kept = subtree(t, k)
    # step 2: the kept nodes, then two new children under different kept nodes
    second = []
    for s in seqs:
        n = len(s.kept)
        second.append(DraftTree(np.r_[s.kept.tokens, [21, 22]], np.r_[s.kept.parents, [n - 1, 1]], cached=n))
    cache.resize(len(seqs), max(s.kv_len for s in seqs))
    batch = pack_trees(second, [s.cache_len for s in seqs], cache.used, torch.float32, model.device)
    assert batch.input_ids.shape[1] == 2  # only the new nodes are fed
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        past_key_values=cache,
        use_cache=True,
    ).logits
    for b, (prompt, tree) in enumerate(zip(prompts, second)):
        for i, node in enumerate(range(tree.cached, len(tree))):
            ref = sequential_logits(model, prompt[:-1] + tree.tokens[tree.path_to(node)].tolist())
            torch.testing.assert_close(logits[b, i], ref, atol=1e-4, rtol=1e-4)


def test_kept_nodes_must_list_parents_first():
    from laser.engine import subtree

    tree = DraftTree([1, 2, 3], [-1, 0, 1])
    with pytest.raises(RuntimeError, match="parent"):
        subtree(tree, [0, 2])  # node 2's parent (1) is dropped


def test_engine_refuses_a_tree_whose_cached_nodes_were_not_kept(tiny_lm):
    """A drafter claiming cached nodes the cache does not hold would read another request's (or stale) KV."""
    from laser.drafting import Drafter

    class Liar(Drafter):
        def propose(self, context, budget=None):
            return DraftTree([context[-1], 5], [-1, 0], cached=1)

    engine = TreeDecodingEngine(tiny_lm.model, TopKVerifier(), eos_ids=set())
    with pytest.raises(RuntimeError, match="cached nodes are not the 0 nodes kept"):
        engine.run([Request(tokens=[3, 4, 5], prompt_len=3, drafter=Liar(), max_new_tokens=2)])


def test_first_path_follows_the_best_child_to_a_leaf():
    import numpy as np

    from laser.tree import DraftTree

    # root 9 -> 1 -> 2 -> 3 (leaf), 1 -> 4, root -> 5
    tree = DraftTree(np.array([9, 1, 2, 3, 4, 5]), np.array([-1, 0, 1, 2, 1, 0]))
    assert tree.first_path() == [1, 2, 3]
    assert DraftTree.chain(9, [7, 8]).first_path() == [7, 8]
    assert DraftTree.chain(9).first_path() == []
