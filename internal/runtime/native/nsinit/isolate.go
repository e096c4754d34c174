package nsinit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// EnvKeep names the environment variable through which the host tells a
// guest that will wait for its config (a prespawned one) which host
// directories to keep: a JSON array of absolute, clean paths, under which
// every path of the config it will get lies. See ParseKeep.
const EnvKeep = "AGENTBOX_GUEST_KEEP"

// maxKeep bounds the directories a guest keeps.
const maxKeep = 16

// ParseKeep decodes and checks the value of EnvKeep: 1 to 16 absolute,
// clean paths other than "/", none below another, without NUL. The value
// comes from the host; it is checked all the same, since the guest mounts
// what it names.
func ParseKeep(v string) ([]string, error) {
	if len(v) > 64<<10 {
		return nil, fmt.Errorf("%s: %d bytes", EnvKeep, len(v))
	}
	var keep []string
	if err := json.Unmarshal([]byte(v), &keep); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvKeep, err)
	}
	if len(keep) == 0 || len(keep) > maxKeep {
		return nil, fmt.Errorf("%s: %d directories, want 1 to %d", EnvKeep, len(keep), maxKeep)
	}
	for i, k := range keep {
		if !filepath.IsAbs(k) || filepath.Clean(k) != k || k == "/" || strings.ContainsRune(k, 0) {
			return nil, fmt.Errorf("%s: %q is not an absolute clean path below /", EnvKeep, k)
		}
		for j, o := range keep {
			if i != j && (k == o || strings.HasPrefix(k, o+"/")) {
				return nil, fmt.Errorf("%s: %q is within %q", EnvKeep, k, o)
			}
		}
	}
	return keep, nil
}

// Under reports whether p (absolute, clean) is one of keep or below one.
func Under(p string, keep []string) bool {
	for _, k := range keep {
		if p == k || strings.HasPrefix(p, k+"/") {
			return true
		}
	}
	return false
}

// keepOnly replaces the guest's copy of the host's mount table (made when
// it was cloned) with a tmpfs root holding only the directories in keep,
// bound recursively at their own paths, a fresh /proc and /sys of its own
// namespaces, and the device nodes a sandbox gets. A prespawned guest
// does this before it waits for its config: otherwise, for as long as it
// waits, it holds a copy of every mount the host had when it was cloned
// (another daemon's loop-mounted disks and bind mounts included) and
// pins them after the host unmounts them. The copies below keep are
// slaves where the host's mounts are shared (the daemon makes its
// sandboxes dir shared for the loop-mounted disk limits), so mounts the
// host makes there later still arrive. Setup then runs as it would in
// the host's copy: every path of its config lies under keep.
func keepOnly(keep []string) error {
	// Nothing made here propagates back (the copies are slaves or
	// private already in a user namespace's mount namespace; this makes
	// sure of it).
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return &SyscallError{Op: "mount", Target: "/", Flags: unix.MS_SLAVE | unix.MS_REC, Err: err}
	}
	// The kept directories: detached recursive copies (with the
	// propagation of what they copy), taken before the tmpfs hides one
	// of them. A bind through a path would copy that tmpfs too.
	trees := make([]int, 0, len(keep))
	defer func() {
		for _, f := range trees {
			unix.Close(f)
		}
	}()
	for _, k := range keep {
		fd, err := unix.OpenTree(unix.AT_FDCWD, k, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return &SyscallError{Op: "open_tree", Target: k, Err: err}
		}
		trees = append(trees, fd)
	}
	// The new root: a tmpfs mounted on the first kept directory, a path
	// that exists and that this guest can reach (the old root, and with
	// it this mount point, is detached below).
	target := keep[0]
	if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=64k"); err != nil {
		return &SyscallError{Op: "mount", Source: "tmpfs", Target: target, Err: err}
	}
	rootFD, err := unix.Open(target, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return &SyscallError{Op: "open", Target: target, Err: err}
	}
	defer unix.Close(rootFD)
	r := rootfs{fd: rootFD}
	for i, k := range keep {
		rel := strings.TrimPrefix(k, "/")
		if err := r.mkdirAll(rel, 0o711); err != nil {
			return err
		}
		dir, err := r.open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		err = unix.MoveMount(trees[i], "", dir, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(dir)
		if err != nil {
			return &SyscallError{Op: "move_mount", Source: k, Target: rel, Err: err}
		}
	}
	// Setup's later proc and sysfs mounts need one of each fully visible
	// in this mount namespace; these are of the guest's own pid and net
	// namespaces. Without sysfs (not allowed here), setup falls back to
	// a tmpfs as it would anyway.
	if err := r.mkdirAll("proc", 0o555); err != nil {
		return err
	}
	if err := r.mount("proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := r.mkdirAll("sys", 0o555); err != nil {
		return err
	}
	_ = r.mount("sys", "sysfs", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err := r.mkdirAll("dev", 0o755); err != nil {
		return err
	}
	for _, d := range devices {
		rel := "dev/" + d
		if err := r.mkfile(rel); err != nil {
			return err
		}
		if err := r.mount(rel, "/dev/"+d, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	// The tmpfs becomes the root, and the host's copy goes.
	return pivotRoot(rootFD)
}

// keepFromEnv returns the directories EnvKeep names (nil when unset) and
// removes the variable from the environment.
func keepFromEnv() ([]string, error) {
	v, ok := os.LookupEnv(EnvKeep)
	if !ok {
		return nil, nil
	}
	_ = os.Unsetenv(EnvKeep)
	return ParseKeep(v)
}
