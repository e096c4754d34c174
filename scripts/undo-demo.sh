#!/usr/bin/env bash
# The undo button: an agent wrecks its sandbox, one call brings it back.
#
# Creates a sandbox from the debian template, writes two migration files,
# checkpoints, deletes them together with /usr/bin/python3 and /usr/bin/git
# (files of the template itself), shows the damage, restores the checkpoint
# (printing how long that took) and proves the files byte-identical (sha256)
# and git and python3 working again.
#
# Environment: AGENTBOX_HOST points at a running daemon; the agentbox binary
# is $AB, else $AGENTBOX/bin/agentbox, else bin/agentbox of this checkout.
# scripts/demo.sh calls it at its end; it also runs on its own:
#   AGENTBOX_HOST=unix:///run/agentbox-demo/agentbox.sock scripts/undo-demo.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AB=${AB:-${AGENTBOX:-$ROOT}/bin/agentbox}
[[ -x $AB ]] || { echo "undo demo: no agentbox binary at $AB" >&2; exit 1; }
: "${AGENTBOX_HOST:?set AGENTBOX_HOST to the daemon address}"

BOLD= PLAIN=
[[ -t 1 ]] && BOLD=$'\033[1m' PLAIN=$'\033[0m'
ustep() { printf '\n%s==== undo: %s ====%s\n' "$BOLD" "$*" "$PLAIN"; }
# ushow CMD...: prints the command as typed, then runs it.
ushow() {
	local out='$' a
	for a in "$@"; do
		[[ $a == "$AB" ]] && a=agentbox
		if [[ $a =~ ^[A-Za-z0-9_./:=@%+-]+$ ]]; then out+=" $a"; else out+=" '${a//\'/\'\\\'\'}'"; fi
	done
	printf '%s\n' "$out"
	"$@"
}
ufail() { printf '\nUNDO DEMO FAILED: %s\n' "$*" >&2; exit 1; }

ustep "A sandbox from the debian template"
echo '$ agentbox create --template debian --label demo=undo'
SB=$("$AB" create --template debian --label demo=undo)
echo "$SB"
CK=
cleanup() {
	"$AB" rm "$SB" >/dev/null 2>&1 || true
	[[ -z $CK ]] || "$AB" checkpoint rm "$CK" >/dev/null 2>&1 || true
}
trap cleanup EXIT

ustep "The agent writes its migrations"
ushow "$AB" exec "$SB" sh -c 'mkdir -p /root/app/migrations &&
printf "CREATE TABLE accounts (id serial primary key, email text not null);\n" > /root/app/migrations/001_init.sql &&
printf "CREATE TABLE users (id serial primary key, account_id int references accounts(id), name text);\nCREATE INDEX users_account ON users(account_id);\n" > /root/app/migrations/002_add_users.sql &&
ls -l /root/app/migrations'
SUMS='sha256sum /root/app/migrations/001_init.sql /root/app/migrations/002_add_users.sql'
BEFORE=$("$AB" exec "$SB" sh -c "$SUMS")
echo "$BEFORE"

ustep "Checkpoint before the risky step"
echo "\$ agentbox checkpoint create --name before-cleanup $SB"
CK=$("$AB" checkpoint create --name before-cleanup "$SB")
echo "$CK"

ustep "The risky step goes wrong"
ushow "$AB" exec "$SB" sh -c 'rm -rf /root/app /usr/bin/python3 /usr/bin/git; echo deleted'
echo "-- the damage:"
ushow "$AB" exec "$SB" sh -c 'ls /root/app 2>&1; git version 2>&1; python3 -c "print(6*7)" 2>&1' || true

ustep "Undo: restore the checkpoint"
echo "\$ agentbox restore $SB $CK"
OUT=$("$AB" restore "$SB" "$CK")
echo "$OUT"
MS=$(sed -n 's/.* in \([0-9]*\) ms$/\1/p' <<<"$OUT")
printf '%srestore took %s ms%s\n' "$BOLD" "${MS:-?}" "$PLAIN"

ustep "Everything is back, byte for byte"
AFTER=$("$AB" exec "$SB" sh -c "$SUMS")
echo "$AFTER"
[[ $AFTER == "$BEFORE" ]] || ufail "migrations differ after restore"
echo "sha256 identical to before the damage"
ushow "$AB" exec "$SB" git version
ushow "$AB" exec "$SB" python3 -c 'print(6*7)'
[[ $("$AB" exec "$SB" python3 -c 'print(6*7)') == 42 ]] || ufail "python3 does not work after restore"
ushow "$AB" checkpoint ls "$SB"
