"""Downstream CTR check: samples from new histories (``samples``), DIN and DCNv2 with knowledge vectors
(``features``, ``networks``, ``train``), source comparison (``compare``), one `laser ctr-eval` run
(``evaluate``, configured by ``config``) and its report (``report``)."""
