// Package tarcheck holds the checks every tar extractor in agentbox makes
// before it writes an entry (the guest's archive upload, layer and image
// import, the CLI's download): sparse entries are recognised so they can be
// refused, and a regular file must fit in the room left on the target
// filesystem.
//
// Sparse entries are refused rather than extracted because archive/tar
// hides the sparse map and hands out the logical content, holes as zeros:
// a 10 KiB archive declaring a 2 GiB sparse file would be written as 2 GiB
// of data. Go's tar writers (docker, buildkit, agentbox itself) never emit
// sparse entries; GNU tar does only when asked (-S).
package tarcheck

import (
	"archive/tar"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Sparse reports whether hdr is a sparse file in any of the forms
// archive/tar expands: old-GNU type 'S' or a PAX header carrying GNU.sparse
// records (formats 0.0, 0.1 and 1.0).
func Sparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// ErrSparse is the error for a sparse entry named name; it wraps
// errdefs.ErrInvalidArgument.
func ErrSparse(name string) error {
	return fmt.Errorf("tar entry %q is a sparse file, which is not supported: %w", name, errdefs.ErrInvalidArgument)
}

// Room returns an error wrapping errdefs.ErrResourceExhausted unless the
// filesystem holding fd (statfs: free blocks and inodes available to the
// caller, which reflect a disk quota mounted there) has room for one more
// inode and size bytes, while keeping keepPercent of its blocks free (0
// for none). Filesystems that report no inode count are not checked for
// inodes.
func Room(fd int, name string, size int64, keepPercent uint64) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return fmt.Errorf("statfs for tar entry %q: %w", name, err)
	}
	return room(&st, name, size, keepPercent)
}

func room(st *unix.Statfs_t, name string, size int64, keepPercent uint64) error {
	if st.Files > 0 && st.Ffree == 0 {
		return fmt.Errorf("tar entry %q: no free inode left: %w", name, errdefs.ErrResourceExhausted)
	}
	if st.Bsize <= 0 {
		return nil
	}
	bsize := uint64(st.Bsize)
	keep := st.Blocks / 100 * keepPercent
	if st.Bavail < keep {
		return fmt.Errorf("tar entry %q: the filesystem is full: %w", name, errdefs.ErrResourceExhausted)
	}
	if size <= 0 {
		return nil
	}
	// In blocks, rounded up, so nothing can overflow.
	need := uint64(size-1)/bsize + 1
	if need > st.Bavail-keep {
		return fmt.Errorf("tar entry %q declares %d bytes, %d are free: %w",
			name, size, (st.Bavail-keep)*bsize, errdefs.ErrResourceExhausted)
	}
	return nil
}
