"""Entry points: the `laser` command line, YAML job configs, Ray Jobs submission."""
