PYTHON ?= python3

.PHONY: install test bench llama e2e clean

install:
	$(PYTHON) -m pip install -e '.[test]'

test:
	$(PYTHON) -m pytest -q --ignore=tests/e2e

# llama.cpp's llama-eval-callback, built once into a cache folder outside the repository (about 4 minutes on 2 cores)
llama:
	scripts/build_llama.sh

# end to end: the real binary piped into attncheck (builds it first when the cache folder has none)
e2e:
	bin="$$(scripts/build_llama.sh)" && bin="$$(printf '%s\n' "$$bin" | tail -n 1)" && test -x "$$bin" && \
	LLAMA_EVAL_CALLBACK="$$bin" $(PYTHON) -m pytest -q tests/e2e

bench:
	$(PYTHON) bench/bench.py

clean:
	rm -rf build .pytest_cache .hypothesis
