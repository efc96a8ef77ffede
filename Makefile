.PHONY: setup demo test bench
setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/laser demo

test: setup
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/laser bench decode --json bench-decode.json
