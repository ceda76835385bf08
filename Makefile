# lockext: the conventional entry points, as thin wrappers over scripts/.
#   make run            set up this machine, build, install, start a scratch cluster, psql
#   make test           set up this machine, then run every test
#   make install        build the extension (release) into the system PostgreSQL 15
#   make installcheck   SQL spec (pg_regress) and concurrency spec (isolation) on the scratch cluster
#   make stop           stop the scratch cluster

PG_CONFIG  ?= /usr/lib/postgresql/15/bin/pg_config
PGXS_TEST  := $(shell dirname $$($(PG_CONFIG) --pgxs 2>/dev/null || echo .))/../test
PORT       ?= 5499
export PATH := $(HOME)/.cargo/bin:$(PATH)
export LOCKEXT_PORT := $(PORT)

REGRESS    := $(basename $(notdir $(wildcard tests/pg_regress/sql/*.sql)))
ISOLATION  := $(basename $(notdir $(wildcard tests/isolation/specs/*.spec)))
PGTEST_DIR := /tmp/lockext-pgtest

.PHONY: bootstrap install run stop test unit installcheck cluster-test

bootstrap:
	bash scripts/bootstrap.sh

install: bootstrap
	cargo pgrx install --release --pg-config $(PG_CONFIG)

run: install
	bash scripts/cluster.sh restart
	bash scripts/cluster.sh shell

stop:
	bash scripts/cluster.sh stop

# Unit tests build a debug library into the same PostgreSQL, so `install` comes after them.
test: bootstrap
	$(MAKE) unit
	$(MAKE) install
	$(MAKE) installcheck
	$(MAKE) cluster-test

unit:
	mkdir -p $(PGTEST_DIR) && chown postgres: $(PGTEST_DIR)
	cargo pgrx test pg15 --runas postgres --pgdata $(PGTEST_DIR)/data

installcheck:
	bash scripts/cluster.sh restart
	rm -rf tests/pg_regress/results tests/isolation/results
	$(PGXS_TEST)/regress/pg_regress --host=127.0.0.1 --port=$(PORT) --user=postgres \
	    --inputdir=tests/pg_regress --outputdir=tests/pg_regress --dbname=lockext_regress $(REGRESS) \
	  || { cat tests/pg_regress/regression.diffs; exit 1; }
	$(PGXS_TEST)/isolation/pg_isolation_regress --host=127.0.0.1 --port=$(PORT) --user=postgres \
	    --inputdir=tests/isolation --outputdir=tests/isolation --dbname=lockext_isolation $(ISOLATION) \
	  || { cat tests/isolation/output_iso/regression.diffs tests/isolation/regression.diffs 2>/dev/null; exit 1; }

# Tests against real servers through real client connections: they start their own clusters.
cluster-test: install
	cargo test --release -p lockext-cluster-tests -- --test-threads=1
