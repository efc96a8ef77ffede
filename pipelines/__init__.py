"""Everything between the data and the decoder: ``data`` (inputs, old/new split), ``knowledge`` (the
knowledge job), ``recommend`` (the recommendation job), ``ops`` (lock, ledger, latest view, feature
store), ``ctr`` (downstream evaluation); ``knowledge_store`` (the
knowledge Parquet), ``quality`` (text quality measures), ``config``, ``storage`` and ``interrupts`` serve
them all."""
