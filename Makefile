# Jackdaw: the only build system. Plain GNU make.
#
#   make                 build build/jackdawd and the plugins
#   make run             install missing packages, build, start on 127.0.0.1:8080
#   make test            install missing packages, build, run every test; last line "N passed, N failed"
#   make tsan            concurrency tests under ThreadSanitizer
#   make sanitize        the unit suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make bench-sched | bench-store | bench-compare | bench-e2e | bench-schedules | bench-parse | bench-backlog
#   make hostile         the hostile mix (tests/integration/test_hostile.sh) for 2 minutes
#   make crash | fuzz | docker-smoke | format | clean   (make crash DB=pg: the node on PostgreSQL)
#   make bench-cluster   1, 2, 3 nodes on one PostgreSQL beside SQLite, sharing the cores and capped at
#                        NODE_CPU cores each; targets: 1 node >= 0.5x SQLite (strict durability),
#                        no fall in jobs/s as nodes are added
#   make cluster-test    3 nodes on a throwaway PostgreSQL under SIGKILL/SIGSTOP: nothing lost or run twice
#
# SANITIZER=address|thread builds into build/<sanitizer>/. V=1 shows commands.

SANITIZER ?=
ifeq ($(SANITIZER),)
BUILD ?= build
else
BUILD ?= build/$(SANITIZER)
endif

CC ?= cc
PKGS := libmicrohttpd libcjson sqlite3 libcurl libpq
DEB_PKGS := libmicrohttpd-dev libcjson-dev libsqlite3-dev libcmocka-dev libcurl4-openssl-dev libpq-dev pkg-config \
            tzdata chromium postgresql

PKG_CFLAGS := $(foreach p,$(PKGS) cmocka,$(shell pkg-config --cflags $(p) 2>/dev/null))
OPT ?= -O2
CFLAGS := -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
          -fno-omit-frame-pointer -MMD -MP -I. $(PKG_CFLAGS) $(EXTRA_CFLAGS)
LDFLAGS := $(EXTRA_LDFLAGS)
LIBS_SYS := -lpthread -ldl -lm

ifeq ($(SANITIZER),address)
CFLAGS += -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(SANITIZER),undefined)
CFLAGS += -fsanitize=undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=undefined
endif
ifeq ($(SANITIZER),thread)
CFLAGS += -fsanitize=thread -DJD_TSAN=1
LDFLAGS += -fsanitize=thread
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# ---- layers: each is a static archive; dependencies point one way ----
LAYERS := common scheduler storage plugins server api cli
common_SRC := $(wildcard common/*.c)
scheduler_SRC := $(wildcard scheduler/*.c)
storage_SRC := $(wildcard storage/*.c)
plugins_SRC := $(wildcard plugins/*.c)
server_SRC := $(filter-out server/main.c,$(wildcard server/*.c))
api_SRC := $(wildcard api/*.c)
cli_SRC := $(filter-out cli/main.c,$(wildcard cli/*.c))

# What a unit test in tests/unit/<layer>/ links against, top layer first.
common_DEPS := common
scheduler_DEPS := scheduler common
storage_DEPS := storage common
plugins_DEPS := plugins scheduler common
server_DEPS := server plugins storage scheduler common
api_DEPS := api server plugins storage scheduler common
cli_DEPS := cli common

common_LIBS :=
scheduler_LIBS :=
storage_LIBS := -lsqlite3 $(shell pkg-config --libs libpq 2>/dev/null)
plugins_LIBS := $(shell pkg-config --libs libcjson 2>/dev/null)
server_LIBS := $(shell pkg-config --libs libcjson sqlite3 libpq 2>/dev/null)
api_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
cli_LIBS := $(shell pkg-config --libs libcurl libcjson 2>/dev/null)

lib = $(BUILD)/lib/libjd_$(1).a
obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
deplibs = $(foreach l,$($(1)_DEPS),$(call lib,$(l)))

ALL_OBJ :=
define LAYER_RULES
$(call lib,$(1)): $(call obj,$($(1)_SRC))
	@mkdir -p $$(dir $$@)
	$(Q)rm -f $$@ && ar rcs $$@ $$^
ALL_OBJ += $(call obj,$($(1)_SRC))
endef
$(foreach l,$(LAYERS),$(eval $(call LAYER_RULES,$(l))))

# ---- the dashboard: ui/* compiled into the api layer (api/ui_assets.h) ----
UI_FILES := $(sort $(filter-out ui/README.md,$(wildcard ui/*.*)))
UI_GEN := $(BUILD)/gen/ui_assets.c
$(UI_GEN): $(UI_FILES) tools/ui_embed.sh
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  EMBED   $@")
	$(Q)tools/ui_embed.sh $(UI_FILES) >$@.tmp && mv $@.tmp $@
$(BUILD)/obj/gen/ui_assets.o: $(UI_GEN)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@
$(call lib,api): $(BUILD)/obj/gen/ui_assets.o
ALL_OBJ += $(BUILD)/obj/gen/ui_assets.o

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC(pic) $<")
	$(Q)$(CC) $(CFLAGS) -fPIC -c $< -o $@

# ---- the server binary ----
JACKDAWD := $(BUILD)/jackdawd
$(JACKDAWD): $(call obj,server/main.c) $(call deplibs,api)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(api_LIBS) $(LIBS_SYS)

# ---- the client: cli/ links libcurl, cJSON and common/ only (docs/architecture.md, "Layers") ----
JACKDAW := $(BUILD)/jackdaw
$(JACKDAW): $(call obj,cli/main.c) $(call lib,cli) $(call lib,common)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(cli_LIBS) $(LIBS_SYS)

# ---- plugins: plugins/<name>/*.c -> $(BUILD)/plugins/<name>.so ----
PLUGIN_DIRS := $(patsubst %/,%,$(dir $(wildcard plugins/*/*.c)))
PLUGIN_NAMES := $(sort $(notdir $(PLUGIN_DIRS)))
PLUGIN_SOS := $(patsubst %,$(BUILD)/plugins/%.so,$(PLUGIN_NAMES))
http_PLUGIN_LIBS := $(shell pkg-config --libs libcurl 2>/dev/null)
define PLUGIN_RULE
$(BUILD)/plugins/$(1).so: $(patsubst %.c,$(BUILD)/pic/%.o,$(wildcard plugins/$(1)/*.c))
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  SO      $$@")
	$$(Q)$$(CC) $$(LDFLAGS) -shared -o $$@ $$^ $$($(1)_PLUGIN_LIBS) $(LIBS_SYS)
endef
$(foreach p,$(PLUGIN_NAMES),$(eval $(call PLUGIN_RULE,$(p))))

# Test-only plugins: tests/plugins/<name>/*.c -> $(BUILD)/tests/plugins/<name>.so
TPLUGIN_NAMES := $(sort $(notdir $(patsubst %/,%,$(dir $(wildcard tests/plugins/*/*.c)))))
TPLUGIN_SOS := $(patsubst %,$(BUILD)/tests/plugins/%.so,$(TPLUGIN_NAMES))
define TPLUGIN_RULE
$(BUILD)/tests/plugins/$(1).so: $(patsubst %.c,$(BUILD)/pic/%.o,$(wildcard tests/plugins/$(1)/*.c))
	@mkdir -p $$(dir $$@)
	$$(Q)$$(CC) $$(LDFLAGS) -shared -o $$@ $$^ $(LIBS_SYS)
endef
$(foreach p,$(TPLUGIN_NAMES),$(eval $(call TPLUGIN_RULE,$(p))))

# ---- unit tests: tests/unit/<layer>/test_*.c -> $(BUILD)/tests/test_*  ----
# A test's own link flags: test_x_LDFLAGS (link-time seams, -Wl,--wrap=).
test_tasks_race_LDFLAGS := -Wl,--wrap=jd_store_submit -Wl,--wrap=jd_sched_cancel
UNIT_TESTS :=
define UNIT_RULES
$(1)_TESTS := $(patsubst tests/unit/$(1)/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/$(1)/test_*.c))
$(BUILD)/tests/%: tests/unit/$(1)/%.c $(call deplibs,$(1))
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  TEST    $$@")
	$$(Q)$$(CC) $$(CFLAGS) $$(LDFLAGS) $$($$*_LDFLAGS) -o $$@ $$< $(call deplibs,$(1)) $$($(1)_LIBS) -lcmocka $(LIBS_SYS)
UNIT_TESTS += $$($(1)_TESTS)
test-unit-$(1): $$($(1)_TESTS) $(PLUGIN_SOS) $(TPLUGIN_SOS)
	$(Q)JD_BUILD=$(BUILD) tests/run.sh $$($(1)_TESTS)
.PHONY: test-unit-$(1)
endef
$(foreach l,$(LAYERS),$(eval $(call UNIT_RULES,$(l))))

# ---- stress tests (meant for TSan): tests/stress/test_*.c link everything ----
STRESS_TESTS := $(patsubst tests/stress/%.c,$(BUILD)/stress/%,$(wildcard tests/stress/test_*.c))
$(BUILD)/stress/%: tests/stress/%.c $(call deplibs,api)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  STRESS  $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(call deplibs,api) $(api_LIBS) -lcmocka $(LIBS_SYS)

# ---- benchmarks: bench/<name>.c -> $(BUILD)/bench/<name> ----
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
$(BUILD)/bench/%: bench/%.c $(call deplibs,api)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  BENCH   $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(call deplibs,api) $(api_LIBS) $(LIBS_SYS)

# ---- targets ----
.DEFAULT_GOAL := all
all: $(JACKDAWD) $(JACKDAW) $(PLUGIN_SOS)

# node and npm from Debian only when there are none (another node package,
# e.g. one bundling npm, conflicts with Debian's npm).
deps:
	@tools/deps.sh $(DEB_PKGS)
	@command -v node >/dev/null || tools/deps.sh nodejs

# puppeteer-core for the browser tests, at the version pinned in
# tests/ui/package-lock.json (it drives Debian's chromium; no browser download).
UI_NODE_MODULES := tests/ui/node_modules/.package-lock.json
ui-deps: $(UI_NODE_MODULES)
$(UI_NODE_MODULES): tests/ui/package.json tests/ui/package-lock.json
	@command -v npm >/dev/null || tools/deps.sh npm
	cd tests/ui && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error

run: deps
	$(Q)$(MAKE) --no-print-directory all
	@mkdir -p data
	$(BUILD)/jackdawd --listen 127.0.0.1:8080 --db data/jackdaw.db --plugin-dir $(BUILD)/plugins $(ARGS)

# Everything a fresh Debian 12 machine needs, then every test, then one summary line.
# Order: unit tests, the concurrency tests under TSan, integration and crash
# tests against the real server, a short fuzz run when clang is present.
TSAN_TESTS = $(STRESS_TESTS) $(scheduler_TESTS) $(plugins_TESTS) $(storage_TESTS) $(server_TESTS) $(api_TESTS)
TEST_SCRIPTS = $(sort $(wildcard tests/integration/test_*.sh tests/crash/test_*.sh tests/fuzz/test_*.sh \
                                  tests/ui/test_*.sh))

TSAN_BUILD ?= build/thread
ASAN_BUILD ?= build/address

test: deps ui-deps
	$(Q)$(MAKE) --no-print-directory all unit-build
	$(Q)$(MAKE) --no-print-directory SANITIZER=thread BUILD=$(TSAN_BUILD) tsan-build
	$(Q)JD_BUILD=$(BUILD) tests/run.sh $(UNIT_TESTS) \
	    $$(ls $(TSAN_BUILD)/stress/test_* $(TSAN_BUILD)/tests/test_* 2>/dev/null | grep -v '\.d$$') \
	    $(TEST_SCRIPTS)

tsan-build: $(TSAN_TESTS) $(PLUGIN_SOS) $(TPLUGIN_SOS)

# The long concurrency run (millions of items) under ThreadSanitizer.
tsan: deps
	$(Q)$(MAKE) --no-print-directory SANITIZER=thread BUILD=$(TSAN_BUILD) tsan-build
	$(Q)JD_BUILD=$(TSAN_BUILD) JD_STRESS=long tests/run.sh \
	    $$(ls $(TSAN_BUILD)/stress/test_* $(TSAN_BUILD)/tests/test_* 2>/dev/null | grep -v '\.d$$')

# The whole suite (unit + integration) under AddressSanitizer + UBSan.
sanitize: deps
	$(Q)$(MAKE) --no-print-directory SANITIZER=address BUILD=$(ASAN_BUILD) all unit-build
	$(Q)JD_BUILD=$(ASAN_BUILD) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    tests/run.sh $$(ls $(ASAN_BUILD)/tests/test_* | grep -v '\.d$$') $(wildcard tests/integration/test_*.sh)

unit-build: $(UNIT_TESTS) $(TPLUGIN_SOS) $(PLUGIN_SOS)

bench-sched: deps
	$(Q)$(MAKE) --no-print-directory $(BUILD)/bench/sched
	$(BUILD)/bench/sched $(if $(W),--workers $(W)) $(if $(ITERS),--iters $(ITERS))

# The slowest job definitions under the default limits: exits 1 past 1 s.
bench-parse: deps
	$(Q)$(MAKE) --no-print-directory $(BUILD)/bench/parse $(PLUGIN_SOS)
	JD_BUILD=$(BUILD) $(BUILD)/bench/parse 2>/dev/null

bench-store: deps
	$(Q)$(MAKE) --no-print-directory $(BUILD)/bench/store
	$(BUILD)/bench/store

bench-compare: deps
	$(Q)$(MAKE) --no-print-directory $(BUILD)/bench/sched
	JD_BUILD=$(BUILD) bench/compare.sh

# 10,000 schedules with "every": "1s" firing real jobs; fire lag p99 beside bare timers.
bench-schedules: deps
	$(Q)$(MAKE) --no-print-directory all $(BUILD)/bench/schedules
	$(BUILD)/bench/schedules --dir $(BUILD) --plugin-dir $(BUILD)/plugins \
	    $(if $(N),--schedules $(N)) $(if $(SECONDS),--seconds $(SECONDS))

bench-e2e: deps
	$(Q)$(MAKE) --no-print-directory all $(BUILD)/bench/loadgen
	JD_BUILD=$(BUILD) bench/e2e/run.sh

# Issue 16: jobs/s, p99, PostgreSQL writes and CPU per job for 1, 2, 3 nodes on one
# PostgreSQL (fsync on) beside SQLite --sync full, interleaved (JOBS=, CONC=, REPS=, CONFIGS=).
# Targets: pg1 / sqlite >= 0.5x; pg2, pg3 / pg1 >= 1.0x.
bench-cluster: deps
	$(Q)$(MAKE) --no-print-directory all $(BUILD)/bench/loadgen
	JD_BUILD=$(BUILD) bench/cluster.sh

# The hostile mix of issue 12 against a real server under ulimit -v, longer
# than the 20 s `make test` gives it (JD_HOSTILE_SECONDS, JD_HOSTILE_WORKERS).
hostile: deps
	$(Q)$(MAKE) --no-print-directory all
	JD_BUILD=$(BUILD) JD_HOSTILE_SECONDS=$${JD_HOSTILE_SECONDS:-120} \
	    JD_HOSTILE_WORKERS=$${JD_HOSTILE_WORKERS:-8} bash tests/integration/test_hostile.sh

# N queued jobs (default 200,000; BIG=1: 1,000,000): RSS, restart until ready, drain rate, RSS after.
bench-backlog: deps
	$(Q)$(MAKE) --no-print-directory all
	JD_BUILD=$(BUILD) N=$(if $(N),$(N),$(if $(BIG),1000000,200000)) bench/backlog.sh

crash: deps
	$(Q)$(MAKE) --no-print-directory all
	JD_BUILD=$(BUILD) CRASH_ROUNDS=$${CRASH_ROUNDS:-20} $(if $(filter pg,$(DB)),CRASH_PG=1) tests/crash/run.sh

# The cluster's proof (issue 16): NODES (3) nodes on one throwaway PostgreSQL,
# ROUNDS (3) rounds of a SIGKILL and a SIGSTOP past two leases under load; then
# docker/nginx.cluster.conf in front of three nodes (when nginx is installed).
cluster-test: deps
	$(Q)$(MAKE) --no-print-directory all
	JD_BUILD=$(BUILD) ROUNDS=$${ROUNDS:-3} LOAD_S=$${LOAD_S:-15} tests/cluster/cluster.sh
	JD_BUILD=$(BUILD) tests/cluster/lb.sh

fuzz: deps
	@tools/deps.sh clang
	JD_BUILD=$(BUILD) tests/fuzz/run.sh $${FUZZ_SECONDS:-60}

docker-smoke:
	docker/smoke.sh

# docker/compose.postgres.yaml in a real engine (docker compose, or
# podman-compose + runc): three nodes behind nginx, one stopped, one crashed.
docker-cluster-smoke:
	docker/cluster_smoke.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build

.PHONY: all deps ui-deps run test tsan tsan-build sanitize unit-build bench-sched bench-parse bench-store \
        bench-compare bench-e2e bench-schedules bench-backlog hostile crash fuzz docker-smoke docker-cluster-smoke format \
        clean

.PHONY: cluster-test bench-cluster

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
