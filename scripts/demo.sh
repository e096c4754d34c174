#!/usr/bin/env bash
# End-to-end demo: builds agentbox, starts a private daemon, builds the
# debian template (cached between runs), and shows a sandbox at work and
# what it cannot see of the host. Needs root.
#
# Usage: sudo scripts/demo.sh
# The demo daemon's data (with the template cache) stays in
# $AGENTBOX_DEMO_DIR (default /var/lib/agentbox-demo); its log is
# $AGENTBOX_DEMO_DIR/serve.log.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
[[ -x /usr/local/go/bin/go ]] && export PATH="/usr/local/go/bin:$PATH"
export GOTOOLCHAIN=local

DEMO_DIR=${AGENTBOX_DEMO_DIR:-/var/lib/agentbox-demo}
RUN_DIR=${AGENTBOX_DEMO_RUN_DIR:-/run/agentbox-demo}
SOCK=$RUN_DIR/agentbox.sock
LOG=$DEMO_DIR/serve.log
CANARY=/tmp/agentbox-demo-canary-$$
export AGENTBOX_HOST=unix://$SOCK
AB=$ROOT/bin/agentbox

STEP=0
BOLD= PLAIN=
[[ -t 1 ]] && BOLD=$'\033[1m' PLAIN=$'\033[0m'
step() {
	STEP=$((STEP + 1))
	printf '\n%s==== %d. %s ====%s\n' "$BOLD" "$STEP" "$*" "$PLAIN"
}
# show CMD...: prints the command as one would type it, then runs it.
show() {
	local out='$' a
	for a in "$@"; do
		[[ $a == "$AB" ]] && a=agentbox
		if [[ $a =~ ^[A-Za-z0-9_./:=@%+-]+$ ]]; then
			out+=" $a"
		else
			out+=" '${a//\'/\'\\\'\'}'"
		fi
	done
	printf '%s\n' "$out"
	"$@"
}
die() {
	printf '\nDEMO FAILED: %s\n' "$*" >&2
	exit 1
}

[[ $(id -u) -eq 0 ]] || die "run as root: sudo $0"

step "Install dependencies (idempotent)"
scripts/install-deps.sh </dev/null

step "Build the static binary bin/agentbox"
mkdir -p bin
show env CGO_ENABLED=0 go build -o bin/agentbox ./cmd/agentbox
ls -l bin/agentbox

SERVE_PID=
SANDBOX=
cleanup() {
	local rc=$?
	set +e
	rm -f "$CANARY"
	if [[ -n $SANDBOX ]]; then
		echo "cleanup: deleting sandbox $SANDBOX"
		"$AB" rm -f "$SANDBOX" >/dev/null 2>&1
	fi
	if [[ -n $SERVE_PID ]] && kill -0 "$SERVE_PID" 2>/dev/null; then
		echo "stopping the demo daemon (pid $SERVE_PID)"
		kill -TERM "$SERVE_PID"
		for _ in $(seq 1 150); do
			kill -0 "$SERVE_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$SERVE_PID" 2>/dev/null && { echo "daemon still running after 15s; killing it"; kill -KILL "$SERVE_PID"; }
		wait "$SERVE_PID" 2>/dev/null
	fi
	if ((rc != 0)) && [[ -f $LOG ]]; then
		printf '\n---- last 40 lines of %s ----\n' "$LOG" >&2
		tail -n 40 "$LOG" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

health() { curl -fsS --max-time 2 --unix-socket "$SOCK" http://agentbox/v1/health >/dev/null 2>&1; }

step "Start the daemon on a private socket ($SOCK), data in $DEMO_DIR"
# Plain 0755 parents: the daemon sets the modes of what it creates below,
# and sandbox uids must be able to traverse to the read-only runner dir.
mkdir -p "$DEMO_DIR" "$RUN_DIR"
if [[ -S $SOCK ]]; then
	health && die "a daemon already answers on $SOCK (another demo running?)"
	rm -f "$SOCK" # stale socket of a demo that was killed
fi
echo "\$ agentbox serve --data-dir $DEMO_DIR/data --socket $SOCK >$LOG 2>&1 &"
"$AB" serve --data-dir "$DEMO_DIR/data" --socket "$SOCK" >"$LOG" 2>&1 </dev/null &
SERVE_PID=$!
for _ in $(seq 1 300); do
	health && break
	kill -0 "$SERVE_PID" 2>/dev/null || die "the daemon exited during start-up"
	sleep 0.1
done
health || die "the daemon did not answer /v1/health within 30s"
echo "daemon pid $SERVE_PID is up:"
show curl -sS --unix-socket "$SOCK" http://agentbox/v1/health
echo

step "Build the debian template (first time 1-3 minutes: mmdebstrap; then cached)"
show "$AB" template build debian
show "$AB" template ls

step "Create a sandbox from the debian template"
echo '$ agentbox create --template debian'
SANDBOX=$("$AB" create --template debian)
echo "$SANDBOX"
show "$AB" ls

step "Run Python inside the sandbox"
show "$AB" exec "$SANDBOX" -- python3 -c 'print(6*7)'
out=$("$AB" exec "$SANDBOX" -- python3 -c 'print(6*7)')
[[ $out == 42 ]] || die "python3 printed '$out', want 42"

step "Copy a file in, read it back"
tmpfile=$(mktemp)
echo "hello from the host, $(date -u +%FT%TZ)" >"$tmpfile"
show "$AB" cp "$tmpfile" "$SANDBOX:/root/hello.txt"
show "$AB" exec "$SANDBOX" -- cat /root/hello.txt
back=$(mktemp)
show "$AB" cp "$SANDBOX:/root/hello.txt" "$back"
cmp -s "$tmpfile" "$back" || die "the file copied out differs from the one copied in"
echo "round trip: identical"
rm -f "$tmpfile" "$back"

step "The host's files are invisible inside"
echo "secret-$$" >"$CANARY"
echo "on the host: $(ls -l "$CANARY")"
printf '$ agentbox exec %s -- cat %s\n' "$SANDBOX" "$CANARY"
if "$AB" exec "$SANDBOX" -- cat "$CANARY"; then
	die "the sandbox could read the host file $CANARY"
fi
echo "-> not visible inside (good)"
printf '$ agentbox exec %s -- ls %s\n' "$SANDBOX" "$DEMO_DIR"
if "$AB" exec "$SANDBOX" -- ls "$DEMO_DIR"; then
	die "the sandbox can list the daemon's data directory"
fi
echo "-> the daemon's data directory is not visible either (good)"

step "Who and where am I inside?"
show "$AB" exec "$SANDBOX" -- hostname
show "$AB" exec "$SANDBOX" -- id
echo "uid_map (inside uid -> host uid -> count): root inside is an unprivileged uid on the host"
show "$AB" exec "$SANDBOX" -- cat /proc/self/uid_map
echo "the sandbox sees only its own processes:"
# minbase Debian has no procps: fall back to reading /proc.
printf '$ agentbox exec %s -- ps aux   (or /proc/*/cmdline where ps is missing)\n' "$SANDBOX"
"$AB" exec "$SANDBOX" -- sh -c 'if command -v ps >/dev/null; then ps aux; else
  echo "  PID  COMMAND"
  for p in /proc/[0-9]*; do printf "%5s  %s\n" "${p#/proc/}" "$(tr "\0\n" "  " <"$p/cmdline" | cut -c1-60)"; done; fi'

step "Delete the sandbox"
show "$AB" rm -f "$SANDBOX"
SANDBOX=
show "$AB" ls

step "The undo button: checkpoint, wreck the sandbox, restore"
AB="$AB" scripts/undo-demo.sh

step "Summary"
cat <<SUMMARY
- built bin/agentbox, started a private daemon (pid $SERVE_PID, log $LOG)
- built (or reused) the debian template and created a sandbox from it
- ran python3 inside (6*7 = 42), copied a file in and out unchanged
- checkpointed a sandbox, deleted files of the app and of the template
  (python3, git), restored it: every file byte-identical again
- the host's $CANARY and the daemon's data were not visible inside;
  inside, root is mapped to an unprivileged host uid and only the
  sandbox's own processes are visible
- deleted the sandbox; the daemon stops now. The template cache stays in
  $DEMO_DIR for the next run (rm -rf it to start over).
DEMO OK
SUMMARY
