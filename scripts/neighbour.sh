#!/usr/bin/env bash
# Runs a command with a neighbour agentbox daemon working beside it, and
# fails when the neighbour was disturbed (finding 9 of issue 11: two
# daemons on one host must not interfere). scripts/test.sh runs the
# integration step inside it.
#
# The neighbour: `agentbox serve` with its own data dir, socket and (by
# derivation from its data dir) cgroup parent; two busy sandboxes (one with
# a disk limit, so a loop-mounted filesystem on the host), one paused; and
# a churn loop creating, using and deleting a sandbox every
# NEIGHBOUR_CHURN_EVERY seconds (10), at most NEIGHBOUR_CHURN_MAX rounds
# (400). Afterwards the neighbour must still be alive, its sandboxes
# running (busy counters advancing), intact (files verified) and paused
# as left, and every churn round must have succeeded. The neighbour is
# then stopped (by PID) and its data removed, on every exit path.
#
# Usage: sudo scripts/neighbour.sh CMD [ARG...]   (bin/agentbox built)
# Exit status: CMD's, or 1 when CMD passed but the neighbour was disturbed
# or could not be started.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${AGENTBOX_NEIGHBOUR_BIN:-$PWD/bin/agentbox}
CHURN_EVERY=${NEIGHBOUR_CHURN_EVERY:-10}
CHURN_MAX=${NEIGHBOUR_CHURN_MAX:-400}
(($# > 0)) || { echo "usage: $0 CMD [ARG...]" >&2; exit 2; }
[[ -x $BIN ]] || { echo "neighbour: $BIN missing (build it first)" >&2; exit 1; }

ND=$(mktemp -d /tmp/abx-neighbour-XXXXXX)
chmod 0711 "$ND" # the sandboxes' mapped uids traverse it
SOCK=$ND/run/agentbox.sock
NPID="" CPID="" SB1="" SB2="" SB3=""
# Every sandbox lives until the end, whatever the daemon's idle policy.
KEEP=(--delete-after never --pause-after never --hibernate-after never)

say() { echo "neighbour: $*"; }

# nb ARGS...: the CLI against the neighbour, bounded.
nb() { timeout 60 "$BIN" --host "unix://$SOCK" "$@"; }

# cleanup stops the churn and the neighbour and removes everything it
# made; it runs on every exit path.
cleanup() {
	local rc=$?
	set +e
	touch "$ND/churn.stop"
	if [[ -n $CPID ]]; then
		kill "$CPID" 2>/dev/null
		wait "$CPID" 2>/dev/null
	fi
	if [[ -n $NPID ]] && kill -0 "$NPID" 2>/dev/null; then
		local id
		for id in $SB1 $SB2 $SB3; do
			nb rm -f "$id" >/dev/null 2>&1
		done
		kill -TERM "$NPID" 2>/dev/null
		for _ in $(seq 200); do
			kill -0 "$NPID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$NPID" 2>/dev/null
		wait "$NPID" 2>/dev/null
	fi
	# Whatever is left in the neighbour's cgroup parent (its name is in
	# its log), and any mount below its dir, goes before its dir does.
	local parent d c
	parent=$(sed -n 's/.*msg="cgroup parent" parent=\([^ ]*\).*/\1/p' "$ND/serve.log" 2>/dev/null | head -n 1)
	if [[ -n $parent ]]; then
		for d in /sys/fs/cgroup/*/"$parent" /sys/fs/cgroup/"$parent"; do
			[[ -d $d ]] || continue
			while read -r c; do
				xargs -r kill -9 <"$c/cgroup.procs" 2>/dev/null
				rmdir "$c" 2>/dev/null
			done < <(find "$d" -mindepth 1 -depth -type d 2>/dev/null)
			rmdir "$d" 2>/dev/null
		done
	fi
	awk -v p="$ND/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n 1 umount -l
	rm -rf "$ND"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start() {
	AGENTBOX_SECRETS_KEY_FILE=$ND/secrets.key "$BIN" serve --data-dir "$ND/data" --socket "$SOCK" --log-level info \
		</dev/null >"$ND/serve.log" 2>&1 &
	NPID=$!
	local i
	for i in $(seq 300); do
		nb info >/dev/null 2>&1 && break
		kill -0 "$NPID" 2>/dev/null || { say "daemon exited at start:"; tail -n 20 "$ND/serve.log"; return 1; }
		((i < 300)) || { say "daemon not healthy after 30 s:"; tail -n 20 "$ND/serve.log"; return 1; }
		sleep 0.1
	done
	SB1=$(nb create "${KEEP[@]}" --label neighbour=busy)
	SB2=$(nb create "${KEEP[@]}" --label neighbour=disk --disk 64M)
	SB3=$(nb create "${KEEP[@]}" --label neighbour=paused)
	# Busy: a counter ticking every second, detached from the exec.
	local busy='echo 0 >/root/count; setsid sh -c "i=0; while :; do i=\$((i+1)); echo \$i >/root/count; sleep 1; done" </dev/null >/dev/null 2>&1 &'
	nb exec "$SB1" -- sh -c "$busy"
	nb exec "$SB2" -- sh -c "dd if=/dev/urandom of=/root/data bs=1M count=8 2>/dev/null && sha256sum /root/data >/root/data.sha && $busy"
	nb exec "$SB3" -- sh -c 'echo paused-marker >/root/marker'
	nb pause "$SB3" >/dev/null
	say "daemon $NPID ($(sed -n 's/.*msg="cgroup parent" parent=\([^ ]*\).*/cgroup parent \1/p' "$ND/serve.log" | head -n 1)), sandboxes $SB1 $SB2 (64M disk) busy, $SB3 paused"
}

# churn creates, uses and deletes a sandbox every CHURN_EVERY seconds until
# churn.stop exists or CHURN_MAX rounds are done; one line per round in
# churn.log.
churn() {
	local n=0 id out
	while ((n < CHURN_MAX)) && [[ ! -e $ND/churn.stop ]]; do
		n=$((n + 1))
		id="" out=""
		if id=$(nb create "${KEEP[@]}" --label neighbour=churn) &&
			out=$(nb exec "$id" -- sh -c 'echo churn-$((6*7)) >/root/f && cat /root/f') &&
			[[ $out == churn-42 ]] && nb rm "$id" >/dev/null; then
			echo "ok $n" >>"$ND/churn.log"
		else
			echo "FAIL $n id=$id out=$out" >>"$ND/churn.log"
			[[ -z $id ]] || nb rm -f "$id" >/dev/null 2>&1 || true
		fi
		for _ in $(seq $((CHURN_EVERY * 10))); do
			[[ -e $ND/churn.stop ]] && break
			sleep 0.1
		done
	done
}

# check reports every way the neighbour was disturbed; 0 when it was not.
check() {
	local bad=0 c1 c2 s1 s2 st marker rounds fails
	touch "$ND/churn.stop"
	wait "$CPID" 2>/dev/null || true
	CPID=""
	rounds=$(grep -c '^ok' "$ND/churn.log" 2>/dev/null || true)
	fails=$(grep -c '^FAIL' "$ND/churn.log" 2>/dev/null || true)
	if ((fails > 0 || rounds == 0)); then
		say "churn: ${rounds:-0} rounds ok, ${fails:-0} failed:"
		grep '^FAIL' "$ND/churn.log" | head -n 5
		bad=1
	fi
	if ! kill -0 "$NPID" 2>/dev/null; then
		say "the daemon died:"
		tail -n 30 "$ND/serve.log"
		return 1
	fi
	st=$(nb inspect "$SB3" | grep -o '"state": *"[a-z]*"' | head -n 1 || true)
	if [[ $st != *'"paused"' ]]; then
		say "sandbox $SB3 was left paused, now $st"
		bad=1
	fi
	c1=$(nb exec "$SB1" -- cat /root/count || true)
	s1=$(nb exec "$SB2" -- cat /root/count || true)
	sleep 2.5
	c2=$(nb exec "$SB1" -- cat /root/count || true)
	s2=$(nb exec "$SB2" -- cat /root/count || true)
	if ! [[ $c1 =~ ^[0-9]+$ && $c2 =~ ^[0-9]+$ && $s1 =~ ^[0-9]+$ && $s2 =~ ^[0-9]+$ ]] || ((c2 <= c1 || s2 <= s1)); then
		say "busy sandboxes not running: $SB1 counter $c1 -> $c2, $SB2 counter $s1 -> $s2"
		bad=1
	fi
	if ! nb exec "$SB2" -- sha256sum -c /root/data.sha >/dev/null; then
		say "sandbox $SB2's file does not match its checksum"
		bad=1
	fi
	marker=$(nb exec "$SB3" -- cat /root/marker || true)
	if [[ $marker != paused-marker ]]; then
		say "sandbox $SB3's marker is '$marker'"
		bad=1
	fi
	if ((bad)); then
		say "DISTURBED; daemon log tail:"
		tail -n 30 "$ND/serve.log"
		return 1
	fi
	say "undisturbed: daemon alive, busy sandboxes counted to $c2 and $s2, the 8 MiB file verified, the paused one still paused with its file, $rounds/$rounds churn rounds ok"
}

start
churn &
CPID=$!
rc=0
"$@" || rc=$?
check || { ((rc != 0)) || rc=1; }
exit "$rc"
