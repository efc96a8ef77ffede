"""Everything between the data and the decoder, a room each: ``data`` (inputs, old/new split),
``knowledge`` (the knowledge job), ``workers`` (Ray actors and the driver that feeds them), ``store`` (the
knowledge store, its lock, local and object-store files), ``quality`` (text checks), ``recommend`` (the
recommendation job), ``ops`` (ledger, latest view, feature store, metrics), ``ctr`` (downstream
evaluation). ``config`` is the job config every room reads."""
