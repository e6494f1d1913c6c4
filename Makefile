# Two commands do all the set-up on a fresh machine:
#   make demo   - the chapter run (exact and corrected, and the chapter's own code) + translations +
#                 the book comparison
#   make test   - lint and the test suite (make test-quick: without the tests marked slow)
# The venv's Python: $(PYTHON) if it is 3.8-3.13; if it is not and PYTHON was not given, the newest
# python3.13 ... python3.8 found. Another venv beside it: make VENV=.venv-3.13 PYTHON=python3.13 test
PYTHON ?= python3
SUPPORTED := import sys; sys.exit(not (3, 8) <= sys.version_info[:2] <= (3, 13))
FALLBACKS := python3.13 python3.12 python3.11 python3.10 python3.9 python3.8
WHICH := import sys; print("using Python %d.%d.%d at %s" % (*sys.version_info[:3], sys.executable))
VERSION := import platform; print("Python " + platform.python_version())
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: venv test test-quick demo notebook clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.py constraints.txt
	@py='$(PYTHON)'; version() { "$$1" -c '$(VERSION)' 2>/dev/null || echo "not found"; }; \
	if ! "$$py" -c '$(SUPPORTED)' 2>/dev/null && [ "$(origin PYTHON)" = file ]; then \
	  echo "$$py: $$(version $$py), not 3.8-3.13; trying $(FALLBACKS)"; \
	  for c in $(FALLBACKS); do "$$c" -c '$(SUPPORTED)' 2>/dev/null && { py=$$c; break; }; done; \
	fi; \
	"$$py" -c '$(SUPPORTED)' 2>/dev/null || { echo "error: $$py: $$(version $$py);" \
	  "this project needs Python 3.8-3.13 (make PYTHON=python3.X)" >&2; exit 1; }; \
	"$$py" -c '$(WHICH)' && echo "$$py -m venv $(VENV)" && "$$py" -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel Cython
	$(PIP) install -c constraints.txt -e '.[cpu,test,notebook,serve,ctranslate2]'
	# the d2l library the chapter called, as a test oracle only (no deps: it asks for all of
	# jupyter; the cpu and test extras bring what it imports)
	$(PIP) install --no-deps d2l==0.11.4
	# the later editions' libraries (0.17.6: the classic edition; 1.0.3), each unpacked in a folder
	# of its own: all three are named d2l, and scripts/chapter_oracle.py --edition puts one first
	# on sys.path. Test oracles only: without them their tests are skipped with the reason
	for v in 0.17.6 1.0.3; do $(PIP) install --no-deps --upgrade --target $(VENV)/oracles/d2l-$$v \
	  d2l==$$v || echo "d2l $$v not unpacked: the tests of its edition will be skipped"; done
	# the fast path's fused CPU kernels, compiled against this MXNet (optional: without a
	# C++ compiler the fast path uses MXNet's operators, same numbers, slower)
	$(BIN)/python -m d2l_transformer.kernels || echo "fused kernels not built (see above)"
	touch $@

test: venv
	@$(BIN)/python -c '$(WHICH)'
	$(BIN)/ruff check d2l_transformer scripts tests
	$(BIN)/python -m pytest

test-quick: venv
	@$(BIN)/python -c '$(WHICH)'
	$(BIN)/ruff check d2l_transformer scripts tests
	$(BIN)/python -m pytest -m "not slow"

# the chapter's own code (d2l 0.11.4) runs beside the exact mode, when that oracle is installed
demo: venv
	$(BIN)/python scripts/train_chapter.py --exact-chapter --chapter-code --out $(OUT)/exact
	$(BIN)/python scripts/train_chapter.py --skip-toys --out $(OUT)/corrected
	$(BIN)/d2l-transformer compare $$(test -f $(OUT)/exact/chapter_code/summary.json && \
	  echo $(OUT)/exact/chapter_code) $(OUT)/exact $(OUT)/corrected

notebook: venv
	$(BIN)/jupyter notebook notebooks/transformer.ipynb

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .ruff_cache *.egg-info
