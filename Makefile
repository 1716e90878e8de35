# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-openstack system-deps bench-deps venv redis node-image lint bench clean

$(STAMP): setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# Debian packages the tests use; installed by the project, never by hand.
system-deps:
	@./scripts/system-deps.sh

# What the benchmarks need besides: nginx, the C floor of bench/tls_floor.py (its service is not started).
bench-deps:
	@./scripts/system-deps.sh --bench

# Start a Redis server on 127.0.0.1:6379 unless one already answers.
redis: system-deps
	@./scripts/ensure-redis.sh

demo: system-deps venv
	$(BIN)/slicex demo

# The netns substrate's default node image (debootstrap, ~40 s once per host; kept in /var/lib/slicex/images) and its
# VM form for qemu-vm nodes (Debian's cloud kernel, an initramfs, a qcow2 base; ~20 s more).
node-image: system-deps venv
	@$(BIN)/slicex image build --quiet

# In parallel (pytest-xdist): the files that use the host's network are one work unit, run first and in turn on
# one worker while the others run the rest (tests/conftest.py). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 3
test: system-deps venv redis node-image
	$(BIN)/python -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# The OpenStack substrate against a live cloud: an all-in-one OpenStack Zed from Debian's packages
# (scripts/openstack-aio.sh, docs/substrate-openstack.md; Nova's libvirt driver boots the VM form of the
# catalogue image) installed, started, tested, stopped. Skipped, saying why, only where its packages cannot be
# installed.
test-openstack: venv node-image
	@if ./scripts/openstack-aio.sh install; then \
	  ./scripts/openstack-aio.sh run $(BIN)/python -m pytest -q --durations=10 tests/integration/test_openstack_aio.py; \
	else \
	  echo "test-openstack SKIPPED: the all-in-one OpenStack's Debian packages could not be installed (above)"; \
	fi

lint: venv
	$(BIN)/ruff check .

bench: venv
	$(BIN)/python bench/am_api.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
