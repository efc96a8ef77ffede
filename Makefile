.PHONY: setup demo check test test-unit test-quick bench
setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/laser demo

check: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: setup
	.venv/bin/python -m pytest -q

test-unit: setup
	.venv/bin/python -m pytest -q tests/unit

test-quick: setup
	.venv/bin/python -m pytest -q -m "not slow"

bench: setup
	.venv/bin/laser bench decode --json bench-decode.json
