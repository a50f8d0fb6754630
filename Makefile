# The two commands the README starts with. Both set everything up first (scripts/setup.sh).
.PHONY: setup serve test test-fast bench
export OMP_WAIT_POLICY ?= PASSIVE

setup:
	bash scripts/setup.sh

serve: setup
	.venv/bin/cadence serve

test: setup
	.venv/bin/python -m pytest -q tests

test-fast: setup
	.venv/bin/python -m pytest -q tests -m "not slow"
