#!/usr/bin/env bash
# Installs what building, testing and demonstrating agentbox needs on a
# Debian/Ubuntu host, and nothing else. Idempotent and non-interactive:
# `apt-get update` runs only when a package is missing, Go is checked (never
# downloaded), and the Go modules are fetched through the module proxy.
#
# Usage: sudo scripts/install-deps.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[install-deps] %s\n' "$*"; }
die() { printf '[install-deps] ERROR: %s\n' "$*" >&2; exit 1; }

PACKAGES=(
	busybox-static    # rootfs of the busybox template and the benchmark bundles
	mmdebstrap        # builds the debian template
	ca-certificates
	debian-archive-keyring
	runc crun         # peers in the benchmark
	uidmap            # newuidmap/newgidmap
	iproute2
	util-linux        # unshare, nsenter, mount
	procps            # ps, pgrep
	curl              # health checks over the unix socket
	git
	python3           # the Python SDK's tests (sdk/python/tests, driven by test/python_sdk_test.go)
	make
	gcc libc6-dev     # cgo, which `go test -race` needs
	xfsprogs btrfs-progs e2fsprogs # loop-mounted xfs/btrfs for the reflink storage driver tests; disk quotas
	chromium          # headless browser of the web console's test (test/console_test.go, driven by chromedp)
)
# node and npm run the official TypeScript MCP client of test/mcp_test.go
# (its npm packages are installed below). Checked as commands: a host may
# have them from elsewhere (NodeSource's nodejs bundles npm and conflicts
# with Debian's npm package).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	PACKAGES+=(nodejs npm)
fi
# --- Debian packages -------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if ((${#missing[@]} > 0)); then
	if [[ $(id -u) -ne 0 ]]; then
		die "missing packages: ${missing[*]}; run as root (sudo $0) to install them"
	fi
	command -v apt-get >/dev/null || die "missing packages: ${missing[*]}, and apt-get is not available: install them by hand"
	log "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
else
	log "Debian packages: all present"
fi

# --- Go ---------------------------------------------------------------------
want=$(awk '$1 == "go" { print $2; exit }' go.mod)
[[ -n $want ]] || die "no go directive in go.mod"
case ":$PATH:" in
*:/usr/local/go/bin:*) ;;
*) [[ -x /usr/local/go/bin/go ]] && export PATH="/usr/local/go/bin:$PATH" ;;
esac
howto="install Go >= $want from https://go.dev/dl/ into /usr/local/go (tar -C /usr/local -xzf go$want.linux-amd64.tar.gz) and put /usr/local/go/bin on PATH"
command -v go >/dev/null || die "Go is not installed; $howto"
# GOTOOLCHAIN=local: report the Go that is installed, never fetch another.
have=$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null || true)
have=${have#go}
[[ -n $have ]] || die "cannot run 'go env GOVERSION' with $(command -v go); $howto"
# version_ge A B: A >= B, comparing dotted numbers (1.26rc1 counts as 1.26).
version_ge() {
	local IFS=.
	local -a a b
	read -r -a a <<<"${1%%[!0-9.]*}"
	read -r -a b <<<"${2%%[!0-9.]*}"
	for i in 0 1 2; do
		local x=${a[i]:-0} y=${b[i]:-0}
		((10#$x > 10#$y)) && return 0
		((10#$x < 10#$y)) && return 1
	done
	return 0
}
version_ge "$have" "$want" || die "Go $have at $(command -v go) is older than $want (go.mod); $howto"
log "Go $have at $(command -v go) (go.mod wants >= $want)"

# --- Go modules -------------------------------------------------------------
GOTOOLCHAIN=local go mod download
log "Go modules: downloaded"

# --- npm packages of the test clients ---------------------------------------
# test/mcp_test.go drives the MCP server with the official TypeScript client
# (test/mcpclient), test/e2b_test.go the E2B front door with the real `e2b`
# SDK (test/e2bclient), each pinned by its package-lock.json. They are
# installed with `npm ci` outside the clone, keyed by the lock file's hash,
# in the directory the test uses (the test installs there itself when this
# step has not run).
npm_client() { # name test scripts...
	local name=$1 test=$2
	shift 2
	local lock=test/$name/package-lock.json
	local dir="${XDG_CACHE_HOME:-$HOME/.cache}/agentbox/$name-$(sha256sum "$lock" | cut -c1-16)"
	if [[ -f $dir/node_modules/.agentbox-installed ]]; then
		log "npm packages of test/$name: present in $dir"
		return
	fi
	mkdir -p "$dir"
	cp "test/$name/package.json" "$lock" "${@/#/test/$name/}" "$dir/"
	# Not fatal here: without the npm registry only that test fails (under
	# AGENTBOX_TEST_STRICT=1), saying why, and the rest can still run.
	if (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund); then
		touch "$dir/node_modules/.agentbox-installed"
		log "npm packages of test/$name: installed in $dir"
	else
		log "WARNING: npm ci of test/$name failed (no npm registry?): $test will fail or skip"
	fi
}
npm_client mcpclient TestMCP client.mjs
npm_client e2bclient TestE2BSDK flows.mjs
npm_client codeclient "TestCodeServerE2BSDK and TestCodeInterpreter/E2B" client.mjs e2b.mjs

# --- gVisor's runsc ---------------------------------------------------------
# The gvisor backend (internal/runtime/gvisor) runs sandboxes under runsc,
# built here from the Go module proxy at the version the backend pins
# (gvisor.PinnedVersion, read from its source so it is said in one place),
# statically: a cgo build cannot start its sandbox, which re-executes itself
# in an empty chroot with no dynamic loader. Cached outside the clone, keyed
# by version (the daemon and the tests look there first); 3-4 minutes the
# first time.
runsc_version=$(sed -n 's/^const PinnedVersion = "\(v[^"]*\)"$/\1/p' internal/runtime/gvisor/runsc.go)
[[ -n $runsc_version ]] || die "no PinnedVersion in internal/runtime/gvisor/runsc.go"
runsc_dir="${XDG_CACHE_HOME:-$HOME/.cache}/agentbox/runsc-$runsc_version"
if [[ -x $runsc_dir/runsc ]]; then
	log "runsc $runsc_version: present in $runsc_dir"
else
	log "building runsc $runsc_version (static; 3-4 minutes)"
	tmp=$(mktemp -d "${runsc_dir%/*}/.runsc-build.XXXXXX" 2>/dev/null || { mkdir -p "${runsc_dir%/*}" && mktemp -d "${runsc_dir%/*}/.runsc-build.XXXXXX"; })
	if ! CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$tmp" go install "gvisor.dev/gvisor/runsc@$runsc_version"; then
		rm -rf "$tmp"
		die "building runsc $runsc_version failed (the gvisor backend and its tests need it)"
	fi
	mkdir -p "$runsc_dir"
	mv "$tmp/runsc" "$runsc_dir/runsc"
	rm -rf "$tmp"
	log "runsc $runsc_version: built into $runsc_dir"
fi
