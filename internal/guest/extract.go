package guest

import (
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guest/proto"
	"github.com/agentbox/agentbox/internal/untar"
)

// Extraction rules for an uploaded archive: the rules of package untar
// (names beneath the target, no entry created through a symlink, regular
// files written to a temporary name and renamed, so no partial file is
// ever left behind and a planted symlink is replaced, never written
// through; sparse and unknown entries refused; PAX global headers
// ignored; room for each entry's declared size and a free inode, else
// ErrResourceExhausted, as on ENOSPC/EDQUOT while writing), and:
//
//   - regular files, directories, symlinks, FIFOs and hard links (to an
//     entry inside the target directory) are created, with the archive's
//     permission bits (setuid, setgid and sticky included);
//   - char/block devices are refused: a sandbox gets its devices from the
//     runtime, not from uploads;
//   - owners are kept when the guest runs as root, as far as its user
//     namespace maps them;
//   - nothing is written below a kernel pseudo filesystem (checkFS).

// extractTar extracts the tar stream r below the directory rootFd. On
// error, entries extracted before the failing one stay; the failing
// entry leaves nothing.
func extractTar(rootFd int, r io.Reader, chown bool) error {
	if err := checkFS(rootFd, "target directory"); err != nil {
		return err
	}
	opts := untar.Options{
		HardLinks:       untar.Create,
		FIFOs:           untar.Create,
		Devices:         untar.Refuse,
		Perm:            0o7777,
		OwnerBestEffort: true,
		CheckDir:        checkFS,
	}
	if chown {
		opts.Owner = func(uid, gid int) (int, int, error) { return uid, gid, nil }
	}
	return untar.Extract(context.Background(), rootFd, r, opts)
}

// writeArchive extracts a tar stream from Data frames under req.Path
// (created if missing) by the rules of extractTar.
func (s *server) writeArchive(c *conn, req *proto.Request) error {
	root, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", root, err)
	}
	rootFd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", root, err)
	}
	defer unix.Close(rootFd)
	dr := &dataReader{c: c}
	if err := extractTar(rootFd, dr, os.Geteuid() == 0); err != nil {
		return fmt.Errorf("extracting into %s: %w", root, err)
	}
	if _, err := io.Copy(io.Discard, dr); err != nil { // trailing padding
		return err
	}
	return c.reply(nil)
}
