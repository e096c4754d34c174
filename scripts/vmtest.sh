#!/usr/bin/env bash
# Runs the tests that this host's kernel cannot run inside a QEMU VM with
# Debian's own kernel: the XFS project-quota disk method (needs
# CONFIG_XFS_QUOTA) and the cgroup v2 paths of the native runtime
# (CLONE_INTO_CGROUP, cgroup.kill, cgroup.freeze, the v2 counters), which a
# hybrid cgroup v1/v2 host never takes. The VM is booted with TCG, not
# KVM (CI has no KVM), from an initramfs holding static busybox, the
# file-system tools, the kernel modules, the agentbox binary and the test
# binaries; it has no disk and no network. 2–3 minutes on 2 CPUs.
#
# Steps:
#  1. install the Debian packages it needs (apt-get update only when one is
#     missing) and unpack the kernel package that linux-image-amd64 points
#     to into .cache/vmtest/kernel/ (apt-get download + dpkg-deb -x, then
#     depmod -b for its modules.dep: nothing is installed on the host; kept
#     until the mirror has a newer one);
#  2. build the static agentbox binary, the test guest and the test
#     binaries (go test -c, CGO_ENABLED=0) into .cache/vmtest/bin/;
#  3. build the initramfs: its /init moves itself to a tmpfs root (the
#     sandboxes pivot_root, which the initramfs root refuses), mounts proc,
#     sys, dev and cgroup2 (pure v2: nothing else), loads the modules, puts
#     an ext4 /tmp on a loop file, runs the selected tests with
#     AGENTBOX_TEST_STRICT=1 (the XFS tests make their own loop-mounted XFS
#     with -o prjquota) and prints VMTEST-RESULT;
#  4. boot it with qemu-system-x86_64 -accel tcg under a hard timeout,
#     stream the console (also kept in .cache/vmtest/vm.log) and exit
#     non-zero unless every test binary passed, no test failed, no test
#     skipped but the allowed ones, and the VM printed its result (a hang
#     or a kernel panic fails).
#
# Usage: sudo scripts/vmtest.sh
# Env:   VMTEST_SMP (default: CPUs available, at most 4), VMTEST_MEM_MB
#        (2048), VMTEST_TIMEOUT (hard limit for the VM in seconds, 1320),
#        VMTEST_INTEGRATION_RUN (-test.run pattern for ./test instead of
#        the selection below).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
CACHE=$ROOT/.cache/vmtest

[[ -x /usr/local/go/bin/go ]] && export PATH="/usr/local/go/bin:$PATH"
export GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

SMP=${VMTEST_SMP:-$(nproc)}
((SMP <= 4)) || SMP=4
MEM_MB=${VMTEST_MEM_MB:-2048}
TIMEOUT=${VMTEST_TIMEOUT:-1320}

log() { printf '[vmtest] %s\n' "$*"; }
die() { printf '[vmtest] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (apt-get; the tests in the VM run as its root)"

# --- What runs in the VM ------------------------------------------------------
# The integration tests that take the v2 and XFS paths behind the API,
# about 100 s in the VM; the whole ./test suite passes there too (but for
# the tests that need a Go toolchain or tzdata) in about 6 minutes.
INTEGRATION=(
	TestLimitsDiskQuotaXFSProject              # data dir on XFS -o prjquota: project quotas end to end
	TestLimitsMemoryPidsOpenFiles              # memory.max, pids.max, OOM events from memory.events
	TestResourceBombsContained                 # fork and memory bombs against pids.max and memory.max
	TestLifecyclePauseStopsCPU                 # pause and resume: cgroup.freeze
	TestLifecycleHibernateAndWake              # hibernate (cgroup.kill) and wake (a new cgroup)
	TestLifecycleRestartKeepsSleepingSandboxes # a restarted daemon re-adopts frozen sandboxes
	TestGracefulRestartKeepsSandboxes          # re-adoption: the guest found in its v2 cgroup
	TestDaemonReapsDeadSandboxes               # recovery reaps the cgroups of dead sandboxes
	TestDestroyLeavesNothing                   # delete leaves no cgroup, mount or process
	TestCheckpointRestoreExact                 # checkpoint freezes the sandbox
	TestPoolClaim                              # warm pools: paused sandboxes thawed on claim
	TestPipelineUsageGrowsAfterCPUBurn         # run metering from cpu.stat
	TestTenantQuotas                           # tenant CPU quota from the counters
	TestSecurity                               # the sandbox's view, cgroup namespace included
	TestAdversarialExecTimeoutKillsDescendants # per-exec cgroups under a v2 sandbox cgroup: cgroup.kill on timeout
)
# One line per test binary: name, Go package, -test.run pattern ("" = all).
# Keep the whole run within about 4 minutes on 2 CPUs of CI (TCG runs
# guest code several times slower than the host).
TESTS=(
	# The XFS project-quota method and its bookkeeping; loop ext4 too.
	"diskquota ./internal/diskquota "
	# The native backend on pure cgroup v2: the conformance suite (create,
	# exec, limits read back from cpu.max/memory.max/pids.max, pause and
	# resume through cgroup.freeze, recover, destroy through cgroup.kill,
	# no leftovers), cold and with the (on v2 empty) prespawn pool; guests
	# born in their cgroup (CLONE_INTO_CGROUP); the v2 counters on a real
	# cgroup; fork bomb, OOM and escapees contained.
	"native ./internal/runtime/native "
	# End to end through the daemon (INTEGRATION below).
	"integration ./test ${VMTEST_INTEGRATION_RUN:-^($(IFS='|'; echo "${INTEGRATION[*]}"))\$}"
)
# Tests that may skip in the VM (anything else that skips fails the run:
# the XFS tests skip, even under AGENTBOX_TEST_STRICT, on a kernel without
# CONFIG_XFS_QUOTA, and that must not pass unnoticed here).
ALLOWED_SKIPS=(
	TestNewRemovesPartialZygoteCgroups # zygote cgroups are kept on v1 hierarchies only
)
# Kernel modules the tests need (their dependencies are added from
# modules.dep). crc32c_generic: xfs and ext4 ask the crypto API for crc32c
# at mount time, through request_module, which no modprobe here answers.
MODULES=(crc32c_generic xfs loop overlay ext4 veth bridge)
# Host binaries copied in with their shared libraries (busybox provides the
# rest; these are the real tools the code and tests call).
HOST_TOOLS=(mkfs.xfs xfs_quota xfs_io mkfs.ext4 mke2fs dumpe2fs mount umount losetup)

# --- 1. Packages and the kernel ---------------------------------------------
PACKAGES=(qemu-system-x86 xfsprogs busybox-static e2fsprogs cpio util-linux kmod)
missing=()
for p in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
if ((${#missing[@]} > 0)); then
	log "installing: ${missing[*]}"
	apt-get update -q
	apt_updated=1
	apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi

# kernel_pkg: the linux-image-<abi> package linux-image-amd64 depends on.
kernel_pkg() {
	apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
KPKG=$(kernel_pkg)
if [[ -z $KPKG ]] && ((!apt_updated)); then
	apt-get update -q
	KPKG=$(kernel_pkg)
fi
[[ -n $KPKG ]] || die "apt-cache knows no linux-image-amd64 (is a Debian mirror configured?)"
KVER_PKG=$(apt-cache show --no-all-versions "$KPKG" | awk '/^Version:/ { print $2; exit }')
KREL=${KPKG#linux-image-} # the kernel release, e.g. 6.1.0-57-amd64
KDIR=$CACHE/kernel/${KPKG}_$KVER_PKG
if [[ ! -f $KDIR/.done ]]; then
	log "downloading $KPKG $KVER_PKG"
	rm -rf "$CACHE/kernel"
	dl=$(mktemp -d)
	! id _apt >/dev/null 2>&1 || chown _apt "$dl" # apt downloads as _apt
	(cd "$dl" && apt-get download -q "$KPKG=$KVER_PKG")
	mkdir -p "$KDIR"
	dpkg-deb -x "$dl"/*.deb "$KDIR"
	rm -rf "$dl"
	# modules.dep is made by the package's postinst; make it here.
	depmod -b "$KDIR" "${KPKG#linux-image-}"
	touch "$KDIR/.done"
fi
VMLINUZ=$KDIR/boot/vmlinuz-$KREL
MODDIR=$KDIR/lib/modules/$KREL
[[ -f $VMLINUZ && -f $MODDIR/modules.dep ]] || die "$KPKG has no $VMLINUZ or modules.dep"
log "kernel $KREL ($KPKG $KVER_PKG)"

# --- 2. Binaries --------------------------------------------------------------
BIN=$CACHE/bin
mkdir -p "$BIN"
log "building static binaries into $BIN"
export CGO_ENABLED=0
go build -o "$BIN/agentbox" ./cmd/agentbox
go build -o "$BIN/testguest" ./internal/runtime/runtimetest/testguest
for t in "${TESTS[@]}"; do
	read -r name pkg _ <<<"$t"
	go test -c -o "$BIN/$name.test" "$pkg"
done

# static: no ELF interpreter (the VM has only the libraries of HOST_TOOLS).
for f in "$BIN"/*; do
	if ldd "$f" >/dev/null 2>&1; then
		die "$f is dynamically linked"
	fi
done

# --- 3. The initramfs --------------------------------------------------------
IR=$CACHE/initramfs
rm -rf "$IR"
mkdir -p "$IR"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,newroot,vmtest/mods}

# copy_with_libs FILE: FILE at its own path, with the libraries ldd names.
copy_with_libs() {
	local f=$1 lib
	install -D -m 755 "$f" "$IR$f"
	while read -r lib; do
		[[ -e $IR$lib ]] || install -D -m 755 "$lib" "$IR$lib"
	done < <(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true)
}

BUSYBOX=/bin/busybox
ldd "$BUSYBOX" >/dev/null 2>&1 && die "$BUSYBOX is dynamically linked: install busybox-static"
install -m 755 "$BUSYBOX" "$IR/bin/busybox"
for tool in "${HOST_TOOLS[@]}"; do
	p=$(command -v "$tool") || die "$tool not found"
	copy_with_libs "$(readlink -f "$p")"
	# keep the name the tool was found by (mkfs.ext4 is a link to mke2fs)
	real=$(readlink -f "$p")
	[[ $(basename "$real") == "$tool" ]] || ln -sf "$(basename "$real")" "$IR$(dirname "$real")/$tool"
done
cp /etc/mke2fs.conf "$IR/etc/"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$IR/etc/passwd"
printf 'root:x:0:\n' >"$IR/etc/group"
cp "$BIN"/* "$IR/vmtest/"

# Modules in load order: each one's dependencies (modules.dep) first.
declare -A seen=()
LOAD=()
add_module() {
	local name=$1 rel deps d
	rel=$(awk -v n="$name" -F: '{ m = $1; sub(/.*\//, "", m); sub(/\.ko(\.[a-z]+)?$/, "", m); gsub(/-/, "_", m) } m == n { print $1; exit }' "$MODDIR/modules.dep")
	if [[ -z $rel ]]; then
		grep -Eq "/${name//_/[-_]}\.ko$" "$MODDIR/modules.builtin" 2>/dev/null && return 0
		die "module $name: not in modules.dep nor built in"
	fi
	[[ -n ${seen[$rel]:-} ]] && return 0
	seen[$rel]=1
	deps=$(awk -v r="$rel" -F': *' '$1 == r { print $2; exit }' "$MODDIR/modules.dep")
	for d in $deps; do
		add_module "$(basename "$d" | sed -E 's/\.ko(\.[a-z]+)?$//; s/-/_/g')"
	done
	LOAD+=("$rel")
}
for m in "${MODULES[@]}"; do add_module "$m"; done
: >"$IR/vmtest/modules"
for rel in "${LOAD[@]}"; do
	base=$(basename "$rel")
	case $base in
	*.ko.xz) xz -dc "$MODDIR/$rel" >"$IR/vmtest/mods/${base%.xz}" ;;
	*.ko.zst) zstd -qdc "$MODDIR/$rel" >"$IR/vmtest/mods/${base%.zst}" ;;
	*) cp "$MODDIR/$rel" "$IR/vmtest/mods/" ;;
	esac
	echo "${base%.ko*}.ko" >>"$IR/vmtest/modules"
done
log "modules: $(tr '\n' ' ' <"$IR/vmtest/modules")"

printf '%s\n' "${TESTS[@]}" >"$IR/vmtest/tests"

# Stage 1 (PID 1 on the initramfs root): move everything to a tmpfs and
# switch_root to it: pivot_root(2), which every sandbox does, fails while
# the root is the initramfs itself.
cat >"$IR/init" <<'EOF'
#!/bin/busybox sh
# (moving /bin moves busybox itself: run a copy of it meanwhile)
/bin/busybox cp /bin/busybox /busybox
/busybox mount -t tmpfs -o size=90%,mode=755 root /newroot
for d in /*; do
	case $d in /busybox|/newroot|/proc|/sys|/dev|/init) ;; *) /busybox mv "$d" /newroot/ ;; esac
done
/busybox mkdir -p /newroot/proc /newroot/sys /newroot/dev
exec /busybox switch_root /newroot /vmtest/run.sh
EOF
chmod 755 "$IR/init"

# Stage 2: the test run. Every line it prints that the host reads starts
# with VMTEST.
cat >"$IR/vmtest/run.sh" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /sys/fs/cgroup /root
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
mount -t tmpfs run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
result=PASS
fail() { echo "VMTEST-ERROR: $*"; result=FAIL; }
while read -r m; do insmod /vmtest/mods/$m || fail "insmod $m"; done </vmtest/modules
# /tmp (test temp dirs, daemon data dirs, loop images) is ext4, as on the
# CI host, not tmpfs: overlayfs and directory sizes differ on tmpfs. Its
# image is a sparse file in RAM; discard gives freed blocks back.
truncate -s 16G /tmp.img
mkfs.ext4 -q -E nodiscard /tmp.img || fail "mkfs.ext4 /tmp"
mount -o loop,discard -t ext4 /tmp.img /tmp || fail "mount /tmp"
chmod 1777 /tmp
[ -e /proc/fs/xfs/xqm ] || fail "kernel without XFS quota support"
echo "VMTEST-KERNEL: $(uname -r), cgroup controllers: $(cat /sys/fs/cgroup/cgroup.controllers), $(nproc) CPUs"
cd /tmp
while read -r name pkg run; do
	echo "VMTEST-BEGIN: $name"
	start=$(date +%s)
	AGENTBOX_TEST_STRICT=1 AGENTBOX_BIN=/vmtest/agentbox AGENTBOX_TEST_GUEST=/vmtest/testguest \
		/vmtest/$name.test -test.v -test.count=1 -test.timeout=12m ${run:+-test.run "$run"} 2>&1
	rc=$?
	echo "VMTEST-END: $name rc=$rc $(( $(date +%s) - start ))s"
	[ $rc -eq 0 ] || result=FAIL
done </vmtest/tests
echo "VMTEST-MEMORY: $(free -m | awk '/^Mem:/ { print $3 " MiB used of " $2 }'), /tmp image $(du -m /tmp.img | cut -f1) MiB"
if [ $result != PASS ]; then
	echo "VMTEST: kernel log (tail):"
	dmesg | tail -n 80
fi
echo "VMTEST-RESULT: $result"
sync
poweroff -f
EOF
chmod 755 "$IR/vmtest/run.sh"

INITRD=$CACHE/initrd.cpio.gz
(cd "$IR" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1 >"$INITRD")
log "initramfs $(du -h "$INITRD" | cut -f1)"

# --- 4. Boot -----------------------------------------------------------------
VMLOG=$CACHE/vm.log
log "booting: $SMP CPUs (TCG), ${MEM_MB} MiB, hard timeout ${TIMEOUT}s; console also in $VMLOG"
start=$SECONDS
qrc=0
# loglevel=1: only emergencies (a panic) reach the console, so the test
# output stays readable (and the emulated serial port is not kept busy
# with OOM reports); the VM prints the kernel log tail on failure. TCG
# runs a host thread per virtual CPU: more of them than host CPUs only
# adds contention, hence -smp at most the CPUs we may use.
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 \
	-accel tcg,thread=multi -cpu max -smp "$SMP" -m "$MEM_MB" \
	-nographic -no-reboot -nodefaults -serial stdio -monitor none \
	-kernel "$VMLINUZ" -initrd "$INITRD" \
	-append "console=ttyS0 loglevel=1 panic=-1" \
	</dev/null 2>&1 | sed -u -E 's/\r$//; s/\x1b(\[[?0-9;]*[A-Za-z]|c)//g' | tee "$VMLOG" || qrc=$?
dur=$((SECONDS - start))

# --- Verdict -----------------------------------------------------------------
problems=()
((qrc == 0)) || problems+=("qemu exited with $qrc (124: timed out after ${TIMEOUT}s)")
grep -q '^VMTEST-RESULT: PASS$' "$VMLOG" || problems+=("the VM did not report VMTEST-RESULT: PASS")
for t in "${TESTS[@]}"; do
	read -r name _ <<<"$t"
	grep -Eq "^VMTEST-END: $name rc=0 " "$VMLOG" || problems+=("$name: did not pass")
done
# A renamed test would match no -test.run pattern and pass unseen.
if [[ -z ${VMTEST_INTEGRATION_RUN:-} ]]; then
	for t in "${INTEGRATION[@]}"; do
		grep -q -- "^--- PASS: $t " "$VMLOG" || problems+=("$t: no PASS line")
	done
fi
if grep -Eq -- '--- FAIL' "$VMLOG"; then
	problems+=("failed: $(grep -Eo -- '--- FAIL: [^ ]+' "$VMLOG" | awk '{ print $3 }' | sort -u | tr '\n' ' ')")
fi
while read -r skipped; do
	ok=0
	for a in "${ALLOWED_SKIPS[@]}"; do [[ $skipped == "$a" ]] && ok=1; done
	((ok)) || problems+=("skipped: $skipped")
done < <(grep -Eo -- '--- SKIP: [^ ]+' "$VMLOG" | awk '{ print $3 }' | sort -u)
grep -q 'Kernel panic' "$VMLOG" && problems+=("kernel panic")

passed=$(grep -Ec -- '^--- PASS' "$VMLOG" || true)
if ((${#problems[@]} > 0)); then
	printf '[vmtest] %s\n' "${problems[@]}"
	log "RESULT: FAIL (${dur}s in the VM; console log $VMLOG)"
	exit 1
fi
log "RESULT: PASS ($passed top-level tests in ${dur}s on kernel $KREL, cgroup v2, XFS quota)"
