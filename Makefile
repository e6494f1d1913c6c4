# Two commands do all the set-up on a fresh machine:
#   make demo   - the chapter run (exact and corrected) + translations + the book comparison
#   make test   - lint and the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: venv test demo notebook clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel Cython
	$(PIP) install -c constraints.txt -e '.[cpu,test,notebook]'
	# the d2l library the chapter called, as a test oracle only (its pins do not install on 3.11)
	$(PIP) install --no-deps d2l==0.11.4
	# the fast path's fused CPU kernels, compiled against this MXNet (optional: without a
	# C++ compiler the fast path uses MXNet's operators, same numbers, slower)
	$(BIN)/python -m d2l_transformer.kernels || echo "fused kernels not built (see above)"
	touch $@

test: venv
	$(BIN)/ruff check d2l_transformer scripts tests
	$(BIN)/python -m pytest

demo: venv
	$(BIN)/python scripts/train_chapter.py --exact-chapter --out $(OUT)/exact
	$(BIN)/python scripts/train_chapter.py --skip-toys --out $(OUT)/corrected
	$(BIN)/python scripts/compare.py $(OUT)/exact $(OUT)/corrected

notebook: venv
	$(BIN)/jupyter notebook notebooks/transformer.ipynb

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .ruff_cache *.egg-info
