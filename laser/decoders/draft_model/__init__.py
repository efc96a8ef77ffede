"""Draft-model speculation: the small-LM drafter (``drafter``), TopK-ImpSpecDec verification
(``topk_imp``), its distillation loss (``distill``) and the registered decoders ``spec_sampling`` and
``topk_imp`` (``decoders``)."""
