package layers

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// ExportTar writes layer id's own content (not its parents') to w as a tar
// stream in the OCI image layer form, the inverse of ImportTar:
//
//   - Ownership is shifted back to ids inside the sandbox (host id minus
//     HostID).
//   - Whiteouts (character devices 0:0) become empty ".wh.NAME" files and
//     an opaque directory is followed by an empty ".wh..wh..opq" entry.
//   - Overlay bookkeeping xattrs (user.overlay.*, trusted.overlay.*) are
//     dropped; other user.* xattrs travel as PAX SCHILY.xattr records.
//   - Hardlinks inside the layer are hardlink entries; sockets are skipped.
//
// Entries come in the lexical walk order of TreeHash, starting with the
// root "./", so ImportTar of the stream yields a layer of the same Digest.
func (s *Store) ExportTar(ctx context.Context, id string, w io.Writer) error {
	l, err := s.Get(id)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	inodes := map[uint64]string{}
	err = filepath.WalkDir(l.Path, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(l.Path, path)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: path, Err: err}
		}
		uid, gid := int64(st.Uid)-int64(s.ids.HostID), int64(st.Gid)-int64(s.ids.HostID)
		if uid < 0 || gid < 0 || uid >= int64(s.ids.Size) || gid >= int64(s.ids.Size) {
			return fmt.Errorf("%s is owned by host %d:%d, outside the sandbox id map: %w", rel, st.Uid, st.Gid, errdefs.ErrInvalidArgument)
		}
		hdr := &tar.Header{
			Name:    filepath.ToSlash(rel),
			Mode:    int64(st.Mode & 0o7777),
			Uid:     int(uid),
			Gid:     int(gid),
			ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
			Format:  tar.FormatPAX,
		}
		var body *os.File
		isOpaque := false
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag = tar.TypeDir
			if rel == "." {
				hdr.Name = "./"
			} else {
				hdr.Name += "/"
			}
			isOpaque = opaque(path)
		case unix.S_IFREG:
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeLink, first, 0
					return tw.WriteHeader(hdr)
				}
				inodes[st.Ino] = hdr.Name
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
			if body, err = os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0); err != nil {
				return err
			}
			defer body.Close()
		case unix.S_IFLNK:
			hdr.Typeflag = tar.TypeSymlink
			if hdr.Linkname, err = os.Readlink(path); err != nil {
				return err
			}
			return tw.WriteHeader(hdr)
		case unix.S_IFCHR:
			if st.Rdev == 0 { // a whiteout
				dir, base := filepath.Split(filepath.ToSlash(rel))
				hdr.Name, hdr.Typeflag, hdr.Mode = dir+".wh."+base, tar.TypeReg, 0
				return tw.WriteHeader(hdr)
			}
			hdr.Typeflag = tar.TypeChar
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case unix.S_IFBLK:
			hdr.Typeflag = tar.TypeBlock
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
		default:
			return nil // sockets are not content
		}
		names, err := listxattr(path)
		if err != nil {
			return err
		}
		for _, n := range names {
			if !strings.HasPrefix(n, "user.") || isOverlayXattr(n) {
				continue
			}
			v, err := getxattr(path, n)
			if err != nil {
				return err
			}
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+n] = string(v)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if body != nil {
			n, err := io.Copy(tw, body)
			if err != nil {
				return err
			}
			if n != st.Size {
				return fmt.Errorf("%s changed while exporting: %w", rel, errdefs.ErrConflict)
			}
		}
		if isOpaque {
			name := hdr.Name + ".wh..wh..opq"
			if rel == "." {
				name = ".wh..wh..opq"
			}
			return tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Uid: hdr.Uid, Gid: hdr.Gid, ModTime: hdr.ModTime, Format: tar.FormatPAX})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("exporting layer %s: %w", l.ID, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("exporting layer %s: %w", l.ID, err)
	}
	return nil
}
