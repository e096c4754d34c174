package guest

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// readArchive sends the directory req.Path as a tar stream in Data frames.
// Entries are relative to the directory; symlinks are stored, not followed.
func (s *server) readArchive(c *conn, req *proto.Request) error {
	root, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("archiving %s: %w", root, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: %w", root, errdefs.ErrInvalidArgument)
	}
	if err := checkFSPath(root); err != nil {
		return err
	}
	tw := tar.NewWriter(dataWriter{c})
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		if d.IsDir() && checkFSPath(p) != nil {
			return fs.SkipDir // a pseudo filesystem mounted below root
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		} else if err != nil {
			return err
		}
		return addTarEntry(tw, p, filepath.ToSlash(rel), fi)
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", root, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := c.frame(proto.FrameEOF, nil); err != nil {
		return err
	}
	return c.bw.Flush()
}

func addTarEntry(tw *tar.Writer, p, name string, fi fs.FileInfo) error {
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(unixMode(fi.Mode())),
		ModTime: fi.ModTime(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	}
	switch {
	case fi.Mode().IsRegular():
		// Non-blocking: a FIFO swapped in since the walk saw a regular
		// file must not hang the archive.
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENXIO) {
				return nil // removed or replaced meanwhile
			}
			return err
		}
		defer f.Close()
		// Size is taken from the open file so the header and the data agree
		// unless the file changes while being read.
		ofi, err := f.Stat()
		if err != nil {
			return err
		}
		if !ofi.Mode().IsRegular() {
			return nil // replaced meanwhile
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, ofi.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("reading %s: %w", p, err)
		}
		return nil
	case fi.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case fi.Mode()&fs.ModeNamedPipe != 0:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil // sockets and devices are not archived
	}
	return tw.WriteHeader(hdr)
}
