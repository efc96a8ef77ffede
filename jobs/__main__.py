"""`python -m jobs ...` = `laser ...`: the entry point Ray Jobs run, which needs no installed console script."""

from jobs.cli import app

app(prog_name="laser")
