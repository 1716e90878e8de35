# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test system-deps venv redis node-image lint bench clean

$(STAMP): setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# Debian packages the tests use; installed by the project, never by hand.
system-deps:
	@./scripts/system-deps.sh

# Start a Redis server on 127.0.0.1:6379 unless one already answers.
redis: system-deps
	@./scripts/ensure-redis.sh

demo: system-deps venv
	$(BIN)/slicex demo

# The netns substrate's default node image (debootstrap, ~40 s once per host; kept in /var/lib/slicex/images).
node-image: system-deps venv
	@$(BIN)/slicex image build --quiet

test: system-deps venv redis node-image
	$(BIN)/python -m pytest -q --durations=20 tests

lint: venv
	$(BIN)/ruff check .

bench: venv
	$(BIN)/python bench/am_api.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
