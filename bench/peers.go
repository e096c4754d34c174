package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stable keys of the measurements; ratios refer to them.
const (
	keyFloor      = "floor"
	keyUnshare    = "unshare"
	keyRuncRun    = "runc-run"
	keyCrunRun    = "crun-run"
	keyCrunNoCg   = "crun-run-nocgroup"
	keyForkExec   = "fork-exec"
	keyRuncExec   = "runc-exec"
	keyNsenter    = "nsenter"
	keyABCreate   = "agentbox-create"
	keyABExec     = "agentbox-exec"
	groupCreate   = "create"
	groupExec     = "exec"
	floorHostUID  = 100000
	floorIDsCount = 65536
)

// sandboxFlags are the namespaces of the physical floor: every namespace a
// sandbox gets, including user and cgroup.
const sandboxFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWNET | unix.CLONE_NEWPID | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUSER

// result is one row of the results table.
type result struct {
	Key   string
	Group string // groupCreate or groupExec
	Name  string // what was run, as shown in the table
	Note  string // how, in one line
	Skip  string // non-empty: not measured, and why
	Summary
}

// bench holds what every measurement needs.
type bench struct {
	n, warmup int
	bundle    string // OCI bundle with a busybox rootfs running /bin/true
	prefix    string // container id prefix, unique to this process
}

// run executes name with args, discarding stdout and returning stderr in the
// error when it fails.
func run(ctx context.Context, name string, args ...string) error {
	return runCmd(exec.CommandContext(ctx, name, args...))
}

// runCmd runs cmd with its stderr captured for the error. A child that
// keeps the stderr pipe open after cmd exits (a detached container) would
// block Wait: such commands must set cmd.Stderr to an *os.File themselves.
func runCmd(cmd *exec.Cmd) error {
	var stderr limitedBuffer
	if cmd.Stderr == nil {
		cmd.Stderr = &stderr
	}
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", cmd, err, stderr.String())
	}
	return nil
}

// limitedBuffer keeps the first 4 KiB written to it.
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return string(l.b) }

// makeBundle writes an OCI bundle under dir whose rootfs holds the static
// busybox with the applets true and sleep, and whose config.json is the
// default of `runc spec` with args set to args and no terminal.
func makeBundle(ctx context.Context, dir string, args []string) error {
	busybox, err := findBusybox()
	if err != nil {
		return err
	}
	rootfsBin := filepath.Join(dir, "rootfs", "bin")
	if err := os.MkdirAll(rootfsBin, 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(rootfsBin, "busybox"), data, 0o755); err != nil {
		return err
	}
	for _, applet := range []string{"true", "sleep", "sh"} {
		if err := os.Symlink("busybox", filepath.Join(rootfsBin, applet)); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, "runc", "spec")
	cmd.Dir = dir
	if err := runCmd(cmd); err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("parsing %s: %w", cfgPath, err)
	}
	proc, ok := cfg["process"].(map[string]any)
	if !ok {
		return fmt.Errorf("%s: no process object", cfgPath)
	}
	proc["args"] = args
	proc["terminal"] = false
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(cfgPath, out, 0o644)
}

// findBusybox returns the path of a statically linked busybox.
func findBusybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("busybox not found (install busybox-static)")
}

func skipped(key, group, name, why string) result {
	return result{Key: key, Group: group, Name: name, Skip: why}
}

// measured builds a row from samples or from the error that stopped them.
func measured(key, group, name, note string, samples []time.Duration, err error) result {
	r := result{Key: key, Group: group, Name: name, Note: note}
	if err != nil {
		r.Skip = "failed: " + err.Error()
		return r
	}
	r.Summary = summarize(samples)
	return r
}

func lookPath(bin string) (string, string) {
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", bin + " not on PATH"
	}
	return p, ""
}

// measureFloor spawns /bin/true straight from Go into fresh mount, uts, ipc,
// net, pid, cgroup and user namespaces (root mapped to host uid 100000): the
// kernel work every sandbox create must pay, with no runtime around it.
func measureFloor(ctx context.Context, b *bench) result {
	const name = "Go spawn of /bin/true in new mnt+uts+ipc+net+pid+cgroup+user ns"
	samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		cmd := exec.CommandContext(ctx, "/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:                 sandboxFlags,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: floorHostUID, Size: floorIDsCount}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: floorHostUID, Size: floorIDsCount}},
			GidMappingsEnableSetgroups: false,
		}
		return runCmd(cmd)
	}, nil)
	return measured(keyFloor, groupCreate, name, "physical floor: exec.Cmd with SysProcAttr.Cloneflags, uid/gid 0→100000", samples, err)
}

// measureUnshare times unshare(1) running true in fresh namespaces.
func measureUnshare(ctx context.Context, b *bench) result {
	const name = "unshare --mount --uts --ipc --net --pid --fork --user --map-root-user true"
	bin, why := lookPath("unshare")
	if why != "" {
		return skipped(keyUnshare, groupCreate, name, why)
	}
	samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		return run(ctx, bin, "--mount", "--uts", "--ipc", "--net", "--pid", "--fork", "--user", "--map-root-user", "true")
	}, nil)
	return measured(keyUnshare, groupCreate, name, "util-linux", samples, err)
}

// measureRuncRun times `runc run` of /bin/true in the busybox bundle.
func measureRuncRun(ctx context.Context, b *bench) result {
	const name = "runc run (busybox bundle, /bin/true)"
	bin, why := lookPath("runc")
	if why != "" {
		return skipped(keyRuncRun, groupCreate, name, why)
	}
	samples, err := timeN(ctx, b.n, b.warmup, func(i int) error {
		cmd := exec.CommandContext(ctx, bin, "run", "--bundle", b.bundle, b.id("runc", i))
		return runCmd(cmd)
	}, func(i int) error {
		return forceDelete(bin, b.id("runc", i))
	})
	return measured(keyRuncRun, groupCreate, name, runtimeVersion(bin)+", default `runc spec` config, cgroupfs", samples, err)
}

// measureCrunRun times `crun run` of the same bundle. crun 1.8 refuses a
// hybrid cgroup host, so, on such a host only, crun runs from an OS thread
// that has its own private mount namespace in which /sys/fs/cgroup/unified
// is unmounted (what `unshare -m sh -c 'umount ...; crun run'` does, minus
// the shell). With noCgroup, crun runs with --cgroup-manager=disabled.
func measureCrunRun(ctx context.Context, b *bench, noCgroup bool) result {
	key, name := keyCrunRun, "crun run (busybox bundle, /bin/true)"
	note := "cgroupfs"
	if noCgroup {
		key, name = keyCrunNoCg, "crun --cgroup-manager=disabled run (same bundle)"
		note = "no cgroup at all (not comparable to a limited sandbox)"
	}
	bin, why := lookPath("crun")
	if why != "" {
		return skipped(key, groupCreate, name, why)
	}
	if cgroupMode() == "hybrid" {
		note += "; hybrid host: run in a private mount ns with /sys/fs/cgroup/unified unmounted"
	}
	note = runtimeVersion(bin) + ", " + note
	var samples []time.Duration
	err := onPrivateCgroupThread(func() error {
		var err error
		samples, err = timeN(ctx, b.n, b.warmup, func(i int) error {
			args := []string{"run", "--bundle", b.bundle, b.id("crun", i)}
			if noCgroup {
				args = append([]string{"--cgroup-manager=disabled"}, args...)
			}
			return runCmd(exec.CommandContext(ctx, bin, args...))
		}, func(i int) error {
			return forceDelete(bin, b.id("crun", i))
		})
		return err
	})
	return measured(key, groupCreate, name, note, samples, err)
}

// onPrivateCgroupThread runs fn on a locked OS thread. On a hybrid cgroup
// host that thread first gets a private mount namespace (propagation made
// private so nothing leaks to the host) with /sys/fs/cgroup/unified
// detached, and every child fn starts inherits it. The thread is thrown
// away afterwards (the goroutine exits still locked).
func onPrivateCgroupThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if cgroupMode() == "hybrid" {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				errc <- fmt.Errorf("unshare mount namespace: %w", err)
				return
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				errc <- fmt.Errorf("making / private: %w", err)
				return
			}
			if err := unix.Unmount("/sys/fs/cgroup/unified", unix.MNT_DETACH); err != nil {
				errc <- fmt.Errorf("unmounting /sys/fs/cgroup/unified: %w", err)
				return
			}
		}
		errc <- fn()
	}()
	return <-errc
}

// forceDelete removes a container by id; a container that is already gone
// is not an error. Runs without ctx so it still cleans up after Ctrl-C.
func forceDelete(runtimeBin, id string) error {
	out, err := exec.Command(runtimeBin, "delete", "--force", id).CombinedOutput()
	if err != nil && !notExist(string(out)) {
		return fmt.Errorf("%s delete --force %s: %w: %s", runtimeBin, id, err, out)
	}
	return nil
}

func notExist(out string) bool {
	for _, s := range []string{"does not exist", "not found", "No such file"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

// measureForkExec times a plain fork/exec of /bin/true on the host.
func measureForkExec(ctx context.Context, b *bench) result {
	samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		return exec.CommandContext(ctx, "/bin/true").Run()
	}, nil)
	return measured(keyForkExec, groupExec, "host fork/exec of /bin/true (exec.Command.Run)", "no isolation at all: the floor of any exec", samples, err)
}

// measureRuncExec times `runc exec` of /bin/true into a running container
// whose pid 1 is sleep.
func measureRuncExec(ctx context.Context, b *bench, dir string) result {
	const name = "runc exec <id> /bin/true (running container)"
	bin, why := lookPath("runc")
	if why != "" {
		return skipped(keyRuncExec, groupExec, name, why)
	}
	bundle := filepath.Join(dir, "sleep-bundle")
	if err := makeBundle(ctx, bundle, []string{"/bin/sleep", "3600"}); err != nil {
		return skipped(keyRuncExec, groupExec, name, "making bundle: "+err.Error())
	}
	id := b.id("runc-exec", 0)
	// The container keeps runc's stdio: give it files, not pipes.
	logf, err := os.Create(filepath.Join(dir, "runc-detach.log"))
	if err != nil {
		return skipped(keyRuncExec, groupExec, name, err.Error())
	}
	defer logf.Close()
	start := exec.CommandContext(ctx, bin, "run", "--detach", "--bundle", bundle, id)
	start.Stdout, start.Stderr = logf, logf
	if err := runCmd(start); err != nil {
		_ = forceDelete(bin, id)
		log, _ := os.ReadFile(logf.Name())
		return skipped(keyRuncExec, groupExec, name, fmt.Sprintf("starting container: %v: %s", err, log))
	}
	defer func() {
		if err := forceDelete(bin, id); err != nil {
			fmt.Fprintln(os.Stderr, "bench: cleanup:", err)
		}
	}()
	samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		return run(ctx, bin, "exec", id, "/bin/true")
	}, nil)
	return measured(keyRuncExec, groupExec, name, runtimeVersion(bin), samples, err)
}

// measureNsenter times `nsenter -t PID -a /bin/true` into a long-running
// process that lives in its own namespaces (the floor's namespace set).
func measureNsenter(ctx context.Context, b *bench) result {
	const name = "nsenter -t <pid> -a /bin/true (long-running namespaced process)"
	bin, why := lookPath("nsenter")
	if why != "" {
		return skipped(keyNsenter, groupExec, name, why)
	}
	target := exec.Command("/bin/sleep", "3600")
	target.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  sandboxFlags,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: floorHostUID, Size: floorIDsCount}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: floorHostUID, Size: floorIDsCount}},
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := target.Start(); err != nil {
		return skipped(keyNsenter, groupExec, name, "starting target: "+err.Error())
	}
	defer func() {
		_ = target.Process.Kill()
		_ = target.Wait()
	}()
	pid := strconv.Itoa(target.Process.Pid)
	samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		return run(ctx, bin, "-t", pid, "-a", "/bin/true")
	}, nil)
	return measured(keyNsenter, groupExec, name, "util-linux; target in mnt+uts+ipc+net+pid+cgroup+user ns", samples, err)
}

// id returns a container id unique to this process, kind and run.
func (b *bench) id(kind string, i int) string {
	return fmt.Sprintf("%s-%s-%d", b.prefix, kind, i)
}

// runtimeVersion returns e.g. "runc 1.1.5+ds1" from `<bin> --version`.
func runtimeVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return filepath.Base(bin)
	}
	return firstLine(string(out))
}
