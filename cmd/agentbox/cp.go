package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/tarcheck"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func cpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between the host and a sandbox",
		Long: `Copy files or directories between the host and a sandbox. Exactly one of
SRC and DST is ID:/absolute/path inside a sandbox. Files are streamed;
directories travel as tar archives. "-" as SRC reads a file from stdin;
"-" as DST writes a file's bytes (or a directory's tar archive) to stdout.
If DST is an existing directory, SRC is copied into it. A local SRC ending
in "/." copies the directory's contents rather than the directory.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseCpArg(args[0]), parseCpArg(args[1])
			if (src.id == "") == (dst.id == "") {
				return errors.New("exactly one of SRC and DST must be ID:/path inside a sandbox")
			}
			for _, a := range []cpArg{src, dst} {
				if a.id != "" && !path.IsAbs(a.path) {
					return fmt.Errorf("path inside sandbox %s must be absolute, got %q", a.id, a.path)
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if src.id != "" {
				return copyFromSandbox(cmd, c.Sandbox(src.id), src.path, dst.path)
			}
			return copyToSandbox(cmd, src.path, c.Sandbox(dst.id), dst.path)
		},
	}
}

type cpArg struct{ id, path string }

// parseCpArg splits "ID:/path" (remote) from a local path. A path starting
// with "/", "." or "~", and "-", are always local.
func parseCpArg(s string) cpArg {
	if s == "-" || strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") || strings.HasPrefix(s, "~") {
		return cpArg{path: s}
	}
	id, p, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return cpArg{path: s}
	}
	return cpArg{id: id, path: p}
}

func copyToSandbox(cmd *cobra.Command, src string, sb *agentbox.Sandbox, dst string) error {
	ctx := cmd.Context()
	if src == "-" {
		return sb.WriteFileFrom(ctx, dst, cmd.InOrStdin(), 0o644)
	}
	contents := strings.HasSuffix(src, "/.")
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	target := dst
	if !contents {
		if rs, err := sb.Stat(ctx, dst); err == nil && rs.Type == api.FileTypeDir {
			target = path.Join(dst, filepath.Base(src))
		} else if err != nil && !agentbox.IsNotFound(err) {
			return err
		}
	}
	if !st.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		return sb.WriteFileFrom(ctx, target, f, st.Mode().Perm())
	}
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := tw.AddFS(os.DirFS(src))
		if cerr := tw.Close(); err == nil {
			err = cerr
		}
		pw.CloseWithError(err)
	}()
	err = sb.UploadDir(ctx, target, pr)
	pr.CloseWithError(errors.New("upload ended")) // unblock the archiver if the upload failed
	return err
}

func copyFromSandbox(cmd *cobra.Command, sb *agentbox.Sandbox, src, dst string) error {
	ctx := cmd.Context()
	rs, err := sb.Stat(ctx, src)
	if err != nil {
		return err
	}
	isDir := rs.Type == api.FileTypeDir
	if dst == "-" {
		var rc io.ReadCloser
		if isDir {
			rc, err = sb.DownloadDir(ctx, src)
		} else {
			rc, err = sb.OpenFile(ctx, src)
		}
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	target := dst
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		target = filepath.Join(dst, path.Base(src))
	}
	if isDir {
		return downloadDir(ctx, sb, src, target)
	}
	rc, err := sb.OpenFile(ctx, src)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fs.FileMode(rs.Mode).Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("copying %s:%s to %s: %w", sb.ID(), src, target, err)
	}
	return f.Close()
}

func downloadDir(ctx context.Context, sb *agentbox.Sandbox, src, target string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	rc, err := sb.DownloadDir(ctx, src)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := extractTar(rc, target); err != nil {
		return fmt.Errorf("copying %s:%s to %s: %w", sb.ID(), src, target, err)
	}
	return nil
}

// extractTar extracts the archive r under dir. The archive comes from inside
// a sandbox and is untrusted: every write goes through an os.Root, so no
// entry name or symlink can reach outside dir; setuid/setgid bits are
// dropped; devices, FIFOs, hard links and PAX global headers are skipped;
// sparse entries and unknown types are refused (tarcheck: a sparse entry
// would be written at its full logical size); each entry must fit in the
// room left on the destination filesystem before it is written.
func extractTar(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	dirFd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dirFd)
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." {
			continue
		}
		if !fs.ValidPath(name) {
			return fmt.Errorf("archive entry %q escapes the destination", h.Name)
		}
		if tarcheck.Sparse(h) {
			return tarcheck.ErrSparse(h.Name)
		}
		size := int64(0)
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeCont:
			size = h.Size
		case tar.TypeDir, tar.TypeSymlink:
		case tar.TypeLink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo, tar.TypeXGlobalHeader:
			continue
		default:
			return fmt.Errorf("archive entry %q has unsupported type %q", h.Name, h.Typeflag)
		}
		if err := tarcheck.Room(dirFd, h.Name, size, 0); err != nil {
			return err
		}
		perm := fs.FileMode(h.Mode).Perm()
		if dirName := path.Dir(name); dirName != "." {
			if err := root.MkdirAll(dirName, 0o755); err != nil {
				return err
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, perm|0o700); err != nil {
				return err
			}
		case tar.TypeReg, tar.TypeCont:
			f, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("writing %s: %w", name, err)
			}
		case tar.TypeSymlink:
			_ = root.Remove(name)
			if err := root.Symlink(h.Linkname, name); err != nil {
				return err
			}
		}
	}
}
