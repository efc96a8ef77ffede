"""The tuned defaults of LASER's decoder parameters, written once: every engine, decoder and benchmark reads
them from here (a study that changes one passes its own value)."""

RELAXED_K = 2  # relaxed verification: a draft token must be among the target's top-k ...
RELAXED_P = 0.1  # ... and have probability above p (LASER's grid: k 2-3, p 0.05-0.2)
N_MAX = 8  # retrieval: the longest context suffix tried as a trie prefix (LASER's dynamic n, n_max)
RELAXED_FRESH_N = 4  # relaxed verification never accepts a non-argmax token that repeats a token n-gram of the text
