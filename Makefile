# CI runs `make test` (.ci/run); the README's two commands are `make demo` and `make test`.
.PHONY: setup demo test test-fast lint format typecheck bench clean

setup:
	scripts/setup.sh

demo:
	scripts/demo.sh

test:
	scripts/test.sh

test-fast: setup
	.venv/bin/python -m pytest -m "not integration"

lint: setup
	.venv/bin/ruff check lbtune tests benchmarks
	.venv/bin/ruff format --check lbtune tests benchmarks
	.venv/bin/lint-imports

format: setup
	.venv/bin/ruff format lbtune tests benchmarks
	.venv/bin/ruff check --fix lbtune tests benchmarks

typecheck: setup
	.venv/bin/mypy

bench: setup
	for b in benchmarks/*.py; do .venv/bin/python $$b || exit 1; done

clean:
	rm -rf .venv .pytest_cache .ruff_cache .mypy_cache
