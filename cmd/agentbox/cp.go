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
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/untar"
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

// extractTar extracts the archive r under dir with internal/untar, the
// one extractor. The archive comes from inside a sandbox and is
// untrusted: no entry name or symlink can reach outside dir (untar's
// rules), setuid, setgid and sticky bits are dropped, modes are subject
// to the process's umask as for any file the CLI creates, directories
// stay writable by their owner; devices, FIFOs, hard links and PAX global
// headers are skipped; sparse entries and unknown types are refused (a
// sparse entry would be written at its full logical size); each entry
// must fit in the room left on the destination filesystem before it is
// written.
func extractTar(r io.Reader, dir string) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return untar.Extract(context.Background(), fd, r, untar.Options{
		HardLinks:         untar.Skip,
		FIFOs:             untar.Skip,
		Devices:           untar.Skip,
		Perm:              0o777,
		Umask:             processUmask(),
		OwnerWritableDirs: true,
	})
}

// processUmask returns the process's umask (from /proc/self/status,
// which reads it without changing it); 022 when it cannot be read.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0o022
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			if u, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return uint32(u)
			}
		}
	}
	return 0o022
}
