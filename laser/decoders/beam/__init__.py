"""Beam-search decoders for generative recommendation: constrained beam search over an item trie
(``search``), AtSpeed's draft beams (``draft``), its relaxed verification (``relaxed``) and draft
alignment losses (``align``), and the registered decoders ``beam``, ``atspeed`` (``decoders``)."""
