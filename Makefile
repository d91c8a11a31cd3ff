# Every target does its own set-up, so a fresh machine needs nothing but `make`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Debian bookworm's packages: the versions the .deb runs on are the versions we test.
APT_PACKAGES := python3-venv python3-pip python3-setuptools python3-wheel \
	python3-yaml python3-sdnotify python3-psutil python3-pystemd python3-dbus-fast \
	python3-psycopg python3-psycopg-pool python3-prometheus-client python3-pytest python3-hypothesis python3-matplotlib python3-croniter \
	python3-pytest-xdist \
	systemd-container dbus
# Building and testing the packages: the .deb's tools, rpmbuild, and mmdebstrap for
# the clean Debian the package test installs the .deb into.
APT_PACKAGES += debhelper dh-python pybuild-plugin-pyproject python3-all lintian \
	rpm mmdebstrap
# promtool for the alert rules' tests; the PostgreSQL server the tests start themselves.
APT_PACKAGES += prometheus postgresql-15
# faketime: the clock-step fault test steps the wall clock of the daemon and its workers.
APT_PACKAGES += faketime
# pgbouncer: the fixed connection pool of the dependency-ceiling test and bench (bench/ceilings/).
APT_PACKAGES += pgbouncer
# The Cockpit page's browser test: Cockpit's web server and bridge, Debian's Chromium
# driven by Selenium, and the chart library the page loads from /usr/share/javascript.
APT_PACKAGES += cockpit-ws cockpit-bridge cockpit-system libjs-dygraphs \
	chromium chromium-driver python3-selenium
PYTEST_ARGS ?=
UNIT_PROCESSES ?= $(shell nproc)

.PHONY: test check deps venv unit system demo bench clean

deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/.installed: pyproject.toml
	$(MAKE) deps
	rm -rf $(VENV)
	/usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

venv: deps $(VENV)/.installed

# The unit tests are pure CPU (simulations, the store's contract): they run on every core.
# The integration and system tests time real processes and run one at a time; the
# slowest are listed, to keep the whole run well inside CI's limit.  Exit status 5 is
# "no test selected" (a PYTEST_ARGS filter that leaves one half empty).
test: venv
	$(PY) -m pytest -n $(UNIT_PROCESSES) $(PYTEST_ARGS) tests/unit || [ $$? -eq 5 ]
	$(PY) -m pytest --durations=20 $(PYTEST_ARGS) tests/integration tests/system || [ $$? -eq 5 ]

# The loop after every edit: the pure tests (policy, config, the store's contract on
# SQLite, the worker and the CLIs against fakes), without PostgreSQL, systemd or the
# minutes-long simulations (docs/testing.md).
check: venv
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" -k "not postgres" $(PYTEST_ARGS) tests/unit

unit: venv
	$(PY) -m pytest -n $(UNIT_PROCESSES) $(PYTEST_ARGS) tests/unit

system: venv
	$(PY) -m pytest $(PYTEST_ARGS) tests/system

# Queue benchmark against flexiq 2.1.0 and huey 3.5.4 (bench/README.md). The peers come
# from PyPI into their own venv, never into .venv; BENCH_ARGS=--quick for a smoke run.
BENCH_VENV := bench/.work/venv
BENCH_ARGS ?=

bench: deps
	@test -x $(BENCH_VENV)/bin/python || /usr/bin/python3 -m venv --system-site-packages $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q flexiq==2.1.0 huey==3.5.4
	$(BENCH_VENV)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BENCH_VENV)/bin/python bench/queue_bench.py $(BENCH_ARGS)

# PostgreSQL throughput against procrastinate 3.10.0 and pgqueuer 1.6.0 (bench/README.md),
# on a private PostgreSQL 15 server. The peers come from PyPI into the bench venv (with
# psycopg-pool 3.3.3: procrastinate 3.10 needs a newer pool than Debian's); flexiqd's
# workers run from .venv. BENCH_PG_ARGS=--quick for a smoke run.
.PHONY: bench-pg
BENCH_PG_ARGS ?=

bench-pg: deps venv
	@test -x $(BENCH_VENV)/bin/python || /usr/bin/python3 -m venv --system-site-packages $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q procrastinate==3.10.0 "pgqueuer[asyncpg]==1.6.0" psycopg-pool==3.3.3
	$(BENCH_VENV)/bin/python bench/pg_throughput_bench.py $(BENCH_PG_ARGS)

# The main job: flexiqd, its SQLite queue and the demo app in a throw-away systemd
# container; a burst of jobs, the fleet scaling up live and draining back.
# `make demo HOST=1` uses this machine's own systemd instead (and leaves flexiqd running).
demo: venv
	$(PY) demo/demo.py $(if $(HOST),--host,)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Packages, built offline from the files git tracks or would track (not .venv, build/,
# dist/) by the scripts the package tests use too: dist/flexiqd_<version>_all.deb and
# dist/flexiqd-cockpit_<version>_all.deb (then lintian, which must stay silent), and
# dist/flexiqd-<version>-1.noarch.rpm with dist/flexiqd-cockpit-<version>-1.noarch.rpm.
.PHONY: deb rpm man deb-deps rpm-deps
DEB_VERSION = $(shell dpkg-parsechangelog -l debian/changelog -S Version)

# Only what the build needs: debian/control's Build-Depends (the build-time unit tests'
# modules among them, unless DEB_BUILD_PROFILES=nocheck), lintian and rpmbuild -- not
# the test suite's browser, servers and container tools.
deb-deps:
	@dpkg-checkbuilddeps 2>/dev/null && command -v lintian >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -qq ./ >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lintian >/dev/null; }

rpm-deps:
	@command -v rpmbuild >/dev/null && python3 -c 'import build, installer, setuptools, wheel' 2>/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rpm python3-build \
	    python3-installer python3-setuptools python3-wheel >/dev/null; }

deb: deb-deps
	packaging/build-deb dist
	lintian --pedantic --display-info --display-experimental --fail-on error,warning \
	  dist/flexiqd_$(DEB_VERSION)_$(shell dpkg --print-architecture).changes

rpm: rpm-deps
	packaging/build-rpm dist

# The man pages are generated from the commands' parsers and units/flexiqd.yaml;
# tests/unit/test_manpages.py fails when the committed ones are out of date.
man: venv
	$(PY) man/manpages.py
