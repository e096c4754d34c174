package diskquota

// A Loop's template image: with a default disk limit every sandbox gets a
// loop filesystem, and formatting one (mkfs.ext4, which fsyncs) on the
// create path costs 15-30 ms and much more under concurrency. KeepTemplate
// formats one image of the default limits once, at start-up; Apply of
// those limits copies it instead: the image is sparse (ext4 with lazy
// inode tables and journal: an empty 10 GiB, 512 Ki-inode one holds about
// 250 KiB), so the copy moves only that, in the kernel, and needs no
// fsync (the filesystem's first journal commit flushes the image). Other
// limits are formatted at Apply as before.
//
// Copies share the template's filesystem UUID; ext4 mounts them side by
// side (nothing here mounts by UUID). The template belongs to no sandbox,
// is never mounted, is not listed by IDs, and is deleted by Close and
// remade by the next KeepTemplate (what a daemon killed with SIGKILL left
// is replaced by its successor's).

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// templateDir is where a Loop keeps its template image, below Images.
const templateDir = "template"

// loopTemplate is a formatted, never mounted image of lim.
type loopTemplate struct {
	path string
	lim  Limits
}

// KeepTemplate formats the template image of lim (see above), replacing
// an earlier call's and deleting what a previous daemon left. Not safe to
// call concurrently with itself or Close; safe with Apply.
func (l *Loop) KeepTemplate(ctx context.Context, lim Limits) error {
	l.dropTemplate()
	dir := filepath.Join(l.Images, templateDir)
	if err := os.RemoveAll(dir); err != nil {
		return &Error{Op: "remove", Path: dir, Err: err}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return &Error{Op: "mkdir", Path: dir, Err: err}
	}
	img := filepath.Join(dir, strconv.FormatInt(lim.Bytes, 10)+"-"+strconv.FormatInt(lim.Inodes, 10)+".img")
	if err := createImage(ctx, img, lim); err != nil {
		return err
	}
	l.tmplMu.Lock()
	l.tmpl = &loopTemplate{path: img, lim: lim}
	l.tmplMu.Unlock()
	return nil
}

// Close deletes the template image. Sandboxes' images and mounts are
// untouched. Idempotent.
func (l *Loop) Close() error {
	l.dropTemplate()
	dir := filepath.Join(l.Images, templateDir)
	if err := os.RemoveAll(dir); err != nil {
		return &Error{Op: "remove", Path: dir, Err: err}
	}
	return nil
}

func (l *Loop) dropTemplate() {
	l.tmplMu.Lock()
	l.tmpl = nil
	l.tmplMu.Unlock()
}

// fromTemplate makes image, which must not exist, a copy of the template
// image when it is of lim, and reports whether it did. On error nothing is
// left and the caller formats image itself.
func (l *Loop) fromTemplate(image string, lim Limits) bool {
	l.tmplMu.Lock()
	t := l.tmpl
	l.tmplMu.Unlock()
	if t == nil || t.lim != lim {
		return false
	}
	if err := copySparse(t.path, image); err != nil {
		_ = os.Remove(image)
		return false
	}
	return true
}

// copySparse copies src to dst (created, 0600), its data extents only:
// dst has src's size and holes where src has them.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := copyExtents(in, out, fi.Size()); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func copyExtents(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if err := copyRange(in, out, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies n bytes at off from in to out, at the same offset.
func copyRange(in, out *os.File, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(n), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
				_, err = io.Copy(io.NewOffsetWriter(out, woff), io.NewSectionReader(in, roff, n))
			}
			return err
		}
		if c == 0 {
			return io.ErrUnexpectedEOF
		}
		n -= int64(c)
	}
	return nil
}
