"""Beam sampling and DSBD, dynamic-width speculative beam sampling: the algorithm (``algorithm``) and
the registered decoders ``beam_sample`` and ``dsbd`` (``decoders``)."""
