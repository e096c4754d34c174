package guest

import (
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Special files. The files API serves regular files only: reading a FIFO
// blocks until a writer comes, a device may block (a tty) or never end
// (/dev/zero) or fail oddly (/dev/tty without a terminal), a socket cannot
// be opened at all, and files of kernel pseudo filesystems (/proc, /sys)
// report size 0, may block (/proc/kmsg) or expose another process's memory
// (/proc/<pid>/mem). Each is refused with ErrInvalidArgument before any
// read or write, decided on the opened descriptor (fstat, fstatfs) where
// there is one, and opens never block (O_NONBLOCK).

// Magic numbers x/sys/unix lacks (linux/magic.h).
const (
	configfsMagic = 0x62656570
	fusectlMagic  = 0x65735543
)

// pseudoFS names the kernel pseudo filesystems whose files the files API
// refuses, by statfs magic.
var pseudoFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:   "procfs",
	unix.SYSFS_MAGIC:        "sysfs",
	unix.DEBUGFS_MAGIC:      "debugfs",
	unix.TRACEFS_MAGIC:      "tracefs",
	unix.SECURITYFS_MAGIC:   "securityfs",
	unix.BPF_FS_MAGIC:       "bpffs",
	configfsMagic:           "configfs",
	unix.EFIVARFS_MAGIC:     "efivarfs",
	unix.PSTOREFS_MAGIC:     "pstore",
	fusectlMagic:            "fusectl",
	unix.DEVPTS_SUPER_MAGIC: "devpts",
}

// kind names the type of a non-regular file for error messages.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "not a regular file"
}

// notRegular is the error for a path the files API will not read or write.
func notRegular(path string, m fs.FileMode) error {
	return fmt.Errorf("%s is %s; only regular files can be read or written: %w", path, kind(m), errdefs.ErrInvalidArgument)
}

// checkFS refuses the filesystem fd is on when it is a pseudo filesystem.
func checkFS(fd int, path string) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", path, err)
	}
	if name, ok := pseudoFS[int64(st.Type)]; ok {
		return fmt.Errorf("%s is on %s; kernel pseudo files are not served: %w", path, name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// openNoMagic opens path like open(2) but refuses (ELOOP, an invalid
// argument) to pass through a /proc magic link (/proc/<pid>/fd/N, exe,
// root, cwd), which would lead out of procfs to whatever the link names.
func openNoMagic(path string, flags int) (int, error) {
	return unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	})
}

// checkFSPath is checkFS for a path, opened without side effects (O_PATH)
// and through no magic link.
func checkFSPath(path string) error {
	fd, err := openNoMagic(path, unix.O_PATH)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer unix.Close(fd)
	return checkFS(fd, path)
}

// openRegular opens path (following symlinks) for reading. It never
// blocks: a path that is not a regular file is refused from its stat before
// any open, and the open itself is non-blocking and without a controlling
// terminal, through no /proc magic link. The decision is made again on the
// opened descriptor, so a file swapped in between is refused too.
func openRegular(path string) (*os.File, fs.FileInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, notRegular(path, fi.Mode())
	}
	fd, err := openNoMagic(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err = f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = notRegular(path, fi.Mode())
	}
	if err == nil {
		err = checkFS(fd, path)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}
