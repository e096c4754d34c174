#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): dependencies, formatting
# and a tidy go.mod, vet, staticcheck, unit tests (root/feature gates strict), the race
# detector, the integration and security suites against the real static
# binary (with a neighbour daemon and its sandboxes working beside them,
# scripts/neighbour.sh), then (vm) what this host's kernel cannot run, in a QEMU VM with
# Debian's kernel: the XFS project-quota tests and the cgroup v2 paths
# (scripts/vmtest.sh). Runs every step even after a failure and prints a
# summary; exits non-zero when any step failed.
#
# Usage (as root): scripts/test.sh            all steps
#                 scripts/test.sh unit race  only these steps
# Steps: deps fmt vet staticcheck build unit race fuzz integration vm
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

[[ -x /usr/local/go/bin/go ]] && export PATH="/usr/local/go/bin:$PATH"
export GOTOOLCHAIN=local # test with the installed Go; never download one
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
STATICCHECK_VERSION=v0.8.2 # staticcheck 2026.2.2, the newest that builds with Go 1.26
export GOBIN="$ROOT/.cache/bin"

ALL_STEPS=(deps fmt vet staticcheck build unit race fuzz integration vm)
STEPS=("$@")
((${#STEPS[@]} > 0)) || STEPS=("${ALL_STEPS[@]}")
for s in "${STEPS[@]}"; do
	[[ " ${ALL_STEPS[*]} " == *" $s "* ]] || { echo "unknown step '$s'; steps: ${ALL_STEPS[*]}" >&2; exit 2; }
done

if [[ $(id -u) -ne 0 ]]; then
	echo "WARNING: not root: the strict suites will fail on their root gates (CI runs as root)" >&2
fi

declare -a SUMMARY=()
FAILED=0

header() { printf '\n==== %s ====\n' "$*"; }

# step NAME CMD...: runs CMD when NAME was asked for, records PASS/FAIL and
# the duration, and carries on after a failure.
step() {
	local name=$1
	shift
	[[ " ${STEPS[*]} " == *" $name "* ]] || return 0
	header "$name: $*"
	local start=$SECONDS rc=0
	"$@" || rc=$?
	local dur=$((SECONDS - start))
	if ((rc == 0)); then
		SUMMARY+=("$(printf 'PASS  %-12s %5ss' "$name" "$dur")")
	else
		SUMMARY+=("$(printf 'FAIL  %-12s %5ss  (exit %s)' "$name" "$dur" "$rc")")
		FAILED=1
	fi
	return 0
}

# existing PATTERN...: the patterns whose directory exists (./sdk/... is
# only tested once sdk/ is there).
existing() {
	local p
	for p in "$@"; do
		[[ -d ${p%/...} ]] && printf '%s\n' "$p"
	done
	return 0
}

check_fmt() {
	local out
	out=$(find . \( -path ./.git -o -path ./.cache -o -path ./bin \) -prune -o -name '*.go' -print0 | xargs -0 -r gofmt -l)
	if [[ -n $out ]]; then
		echo "gofmt -l lists files that need gofmt -w:"
		echo "$out"
		return 1
	fi
	echo "all Go files are gofmt'ed"
}

# go.mod and go.sum say exactly what the code imports: direct dependencies
# are not marked // indirect, nothing unused is listed (go mod tidy -diff
# prints the change tidy would make and fails; it reads only the module
# proxy).
check_tidy() {
	if ! go mod tidy -diff; then
		echo "go.mod/go.sum are not tidy: run go mod tidy and commit the result"
		return 1
	fi
	echo "go.mod and go.sum are tidy"
}

# The fmt step: gofmt and go mod tidy, both reported before failing.
check_fmt_tidy() {
	local rc=0
	check_fmt || rc=1
	check_tidy || rc=1
	return $rc
}

install_staticcheck() {
	if [[ -x $GOBIN/staticcheck ]] && "$GOBIN/staticcheck" -version 2>/dev/null | grep -q "(${STATICCHECK_VERSION#v})"; then
		return 0
	fi
	echo "installing staticcheck $STATICCHECK_VERSION into $GOBIN"
	go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
}

run_staticcheck() {
	install_staticcheck
	"$GOBIN/staticcheck" -version
	"$GOBIN/staticcheck" ./...
}

build() {
	mkdir -p bin
	CGO_ENABLED=0 go build -o bin/agentbox ./cmd/agentbox
	ls -l bin/agentbox
}

# Unit tests: every package but the integration suites in ./test/...
unit() {
	local mod pkgs
	mod=$(go list -m)
	pkgs=$(go list -e ./... | grep -v -x -e "$mod/test" -e "$mod/test/.*")
	# TestCPUYield asserts what the CPU-yield policy does on a host that
	# has spare CPU; with -p 2 another package's tests can take the second
	# core for its whole run, so it runs alone, after the rest.
	local rc=0
	# shellcheck disable=SC2086 # one argument per package
	AGENTBOX_TEST_STRICT=1 go test -count=1 -timeout 20m -skip '^TestCPUYield$' $pkgs || rc=1
	AGENTBOX_TEST_STRICT=1 go test -count=1 -timeout 5m -run '^TestCPUYield$' ./internal/runtime/native/ || rc=1
	return $rc
}

# The race detector on the packages with concurrency. -short: the slow
# tests (template builds) already ran once in the unit step.
race() {
	local pkgs
	mapfile -t pkgs < <(existing ./internal/... ./sdk/...)
	AGENTBOX_TEST_STRICT=1 CGO_ENABLED=1 go test -race -short -count=1 -timeout 20m "${pkgs[@]}"
}

# fuzz_one runs one target. It fails on a crasher, a hang or a build error.
# One failure it does not count: Go 1.26's fuzz coordinator can report the
# end of a duration -fuzztime as "context deadline exceeded" when the deadline
# reaches its own context before the workers' (go.dev/issue/75804, fixed in
# Go 1.27). That race writes no input and prints nothing else; a real finding
# always writes its input to testdata/fuzz/NAME, so the step tells the two
# apart by that file and by the failure's exact text.
fuzz_one() {
	local pkg=$1 name=$2 fuzztime=$3 out corpus before after rc=0
	corpus="$pkg/testdata/fuzz/$name"
	before=$(ls -1 "$corpus" 2>/dev/null | sort)
	out=$(mktemp)
	go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" -fuzzminimizetime=2s "$pkg" 2>&1 | tee "$out" || rc=$?
	after=$(ls -1 "$corpus" 2>/dev/null | sort)
	if ((rc != 0)) && [[ $before == "$after" ]] &&
		[[ $(sed -n "/^--- FAIL: $name /,/^FAIL\$/p" "$out" | sed '1d;$d' | sed 's/^ *//') == "context deadline exceeded" ]]; then
		echo "NOTE: $name ended on the fuzz coordinator's deadline race (go.dev/issue/75804); it wrote no input, so it is not a finding"
		rc=0
	fi
	rm -f "$out"
	((rc == 0)) || echo "FAIL: $name in $pkg"
	return $rc
}

# Every fuzz target of the module (func FuzzXxx in a _test.go file), each for
# FUZZTIME on top of its committed corpus (testdata/fuzz/FuzzXxx), one at a
# time: go test -fuzz takes one target per run. A crasher fails the step and
# is written to the package's testdata/fuzz, ready to commit as a
# regression input.
fuzz() {
	local fuzztime=${FUZZTIME:-15s} pkg name failed=0 n=0
	local -a targets=()
	while IFS= read -r line; do
		targets+=("$line")
	done < <(grep -rl --include='*_test.go' -E '^func Fuzz[A-Z0-9_][A-Za-z0-9_]*\(' . |
		grep -v -e '^./.cache/' -e '^./.git/' | sort |
		while IFS= read -r f; do
			sed -n -E 's/^func (Fuzz[A-Za-z0-9_]+)\(.*/\1/p' "$f" | while IFS= read -r fn; do
				printf '%s %s\n' "./$(dirname "${f#./}")" "$fn"
			done
		done)
	((${#targets[@]} > 0)) || { echo "no fuzz targets found"; return 1; }
	for t in "${targets[@]}"; do
		pkg=${t% *} name=${t#* }
		n=$((n + 1))
		echo "-- $name in $pkg for $fuzztime"
		fuzz_one "$pkg" "$name" "$fuzztime" || failed=1
	done
	echo "$n fuzz targets run for $fuzztime each"
	return $failed
}

# The integration suites run with a neighbour daemon working beside them
# (scripts/neighbour.sh: own data dir, socket and cgroup parent, busy,
# disk-limited and paused sandboxes, a create/exec/delete churn): the
# step fails when the suites fail or the neighbour was disturbed.
integration() {
	[[ -x bin/agentbox ]] || { echo "bin/agentbox missing: the build step failed or was not run"; return 1; }
	[[ -d test ]] || { echo "no ./test directory"; return 1; }
	scripts/neighbour.sh env AGENTBOX_BIN="$ROOT/bin/agentbox" AGENTBOX_TEST_STRICT=1 \
		go test -count=1 -p 1 -timeout 60m -v ./test/...
}

# The XFS project-quota and cgroup v2 tests in a TCG VM (no KVM needed):
# the CI host's kernel lacks CONFIG_XFS_QUOTA and mounts cgroup v1
# controllers, so on it they skip or take the v1 paths.
vm() {
	scripts/vmtest.sh </dev/null
}

START=$SECONDS
# Dependencies first: nothing else can run without them.
if [[ " ${STEPS[*]} " == *" deps "* ]]; then
	header "deps: scripts/install-deps.sh"
	scripts/install-deps.sh </dev/null
	SUMMARY+=("$(printf 'PASS  %-12s %5ss' deps "$SECONDS")")
fi
step fmt check_fmt_tidy
step vet go vet ./...
step staticcheck run_staticcheck
step build build
step unit unit
step race race
step fuzz fuzz
step integration integration
step vm vm

header "summary ($((SECONDS - START))s, $(go version | awk '{print $3}'), kernel $(uname -r))"
printf '%s\n' "${SUMMARY[@]}"
if ((FAILED)); then
	echo "RESULT: FAIL"
	exit 1
fi
echo "RESULT: PASS"
