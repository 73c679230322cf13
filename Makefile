PYTHON ?= python3

.PHONY: install test bench clean

install:
	$(PYTHON) -m pip install -e '.[test]'

test:
	$(PYTHON) -m pytest -q

bench:
	$(PYTHON) bench/bench.py

clean:
	rm -rf build .pytest_cache .hypothesis
