# Convenience targets; each is a thin wrapper around a script or go command
# so a fresh box without make can run the same thing (see README.md).
SHELL := /usr/bin/env bash
export PATH := /usr/local/go/bin:$(PATH)

GO          ?= go
BIN         := bin/agentbox
BENCH_FLAGS ?=

.PHONY: all build test vmtest demo bench clean distclean

all: build

# The static binary: also PID 1 of every sandbox, so it must not need libc.
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/agentbox

# Everything CI runs (install deps, gofmt, vet, staticcheck, unit, race,
# integration + security suites, the VM tests). Needs root.
test:
	scripts/test.sh

# The XFS project-quota and cgroup v2 tests in a QEMU (TCG) VM with
# Debian's kernel (also the last step of `make test`). Needs root.
vmtest:
	scripts/vmtest.sh

# The end-to-end demo against a private daemon. Needs root.
demo:
	scripts/demo.sh

# Benchmarks vs runc, crun, unshare, nsenter and the physical floor.
# `make bench BENCH_FLAGS=-write` also rewrites docs/BENCHMARKS.md. Needs root.
bench: build
	$(GO) run ./bench $(BENCH_FLAGS)
	# Checkpoint/restore per storage driver (copy on the data dir's file
	# system, reflink on loop-mounted xfs and btrfs), fork x10 vs one create,
	# warm-pool claim: Go benchmarks against the real daemon binary.
	AGENTBOX_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench 'CheckpointDriver|RestoreDriver|ForkTen|CreateOne|PoolClaim' -benchtime 10x -count 1 ./test/
	# The flight recorder (docs/AUDIT.md): exec round trip with recording
	# on vs off, events ingested per second, audit verify of 100,000 events.
	AGENTBOX_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench 'ExecRecording' -benchtime 300x -count 1 ./test/
	$(GO) test -run '^$$' -bench 'Append|Verify100k|ScanUpper|TrackedRun' -count 1 ./internal/audit/

clean:
	rm -rf bin

# Also drops the cached tools (staticcheck) and the test VM's kernel and
# initramfs under .cache/.
distclean: clean
	rm -rf .cache
