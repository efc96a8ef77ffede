"""Everything between the data and the decoder: ``data`` (inputs, old/new split), ``knowledge`` (the
knowledge job), ``recommend`` (the recommendation job), ``ops`` (schedule, feature store), ``ctr``
(downstream evaluation), ``tools`` (benchmarks, training); ``config``, ``storage`` and ``interrupts``
serve them all."""
