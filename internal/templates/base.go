package templates

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

type baseKind int

const (
	baseBusybox baseKind = iota + 1
	baseDebian
	baseTemplate
)

// base is a parsed TemplateSpec.Base.
type base struct {
	kind     baseKind
	suite    string   // debian
	packages []string // debian, sorted
	template string   // template
}

var (
	suiteRE   = lazyregexp.New(`^[a-z][a-z0-9-]*$`)
	packageRE = lazyregexp.New(`^[a-z0-9][a-z0-9+.-]+$`)
)

// BuiltinBase reports whether s is a builtin base (busybox, debian:...)
// rather than a template name; it fails for a template name or a
// malformed base.
func BuiltinBase(s string) (bool, error) {
	b, err := parseBase(s)
	if err != nil {
		return false, err
	}
	if b.kind == baseTemplate {
		return false, fmt.Errorf("base %q is a template name: %w", s, errdefs.ErrInvalidArgument)
	}
	return true, nil
}

func parseBase(s string) (base, error) {
	switch s {
	case "busybox", "scratch+busybox":
		return base{kind: baseBusybox}, nil
	case "":
		return base{}, fmt.Errorf("empty base: %w", errdefs.ErrInvalidArgument)
	}
	rest, ok := strings.CutPrefix(s, "debian:")
	if !ok {
		rest, ok = strings.CutPrefix(s, "debootstrap:")
	}
	if !ok {
		if !nameRE.MatchString(s) {
			return base{}, fmt.Errorf("base %q: not busybox, debian:SUITE[+PKGS] or a template name: %w", s, errdefs.ErrInvalidArgument)
		}
		return base{kind: baseTemplate, template: s}, nil
	}
	suite, pkgs, _ := strings.Cut(rest, "+")
	if !suiteRE.MatchString(suite) {
		return base{}, fmt.Errorf("base %q: bad suite %q: %w", s, suite, errdefs.ErrInvalidArgument)
	}
	b := base{kind: baseDebian, suite: suite}
	if pkgs != "" {
		for _, p := range strings.Split(pkgs, ",") {
			if !packageRE.MatchString(p) {
				return base{}, fmt.Errorf("base %q: bad package name %q: %w", s, p, errdefs.ErrInvalidArgument)
			}
			b.packages = append(b.packages, p)
		}
		slices.Sort(b.packages)
		b.packages = slices.Compact(b.packages)
	}
	return b, nil
}

func (b base) String() string {
	switch b.kind {
	case baseBusybox:
		return "busybox"
	case baseDebian:
		if len(b.packages) == 0 {
			return "debian:" + b.suite
		}
		return "debian:" + b.suite + "+" + strings.Join(b.packages, ",")
	default:
		return b.template
	}
}

func hashStrings(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// checkStatic fails unless path is a statically linked ELF executable (no
// program interpreter): it is copied into rootfs images that have no libc.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("busybox %s: %w: %w", path, errdefs.ErrFailedPrecondition, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("busybox %s is dynamically linked (install busybox-static): %w", path, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// busyboxKey is the cache key of the busybox base: it changes with the host
// binary.
func (m *Manager) busyboxKey() (string, error) {
	f, err := os.Open(m.cfg.BusyboxPath)
	if err != nil {
		return "", fmt.Errorf("busybox base: %w: %w", errdefs.ErrFailedPrecondition, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("busybox base: %w", err)
	}
	return hashStrings("base", "busybox", hex.EncodeToString(h.Sum(nil))), nil
}

// buildBusybox makes the busybox rootfs layer: bin/busybox, its applet
// symlinks, minimal /etc, the usual empty directories, all owned by the
// mapped root.
func (m *Manager) buildBusybox(ctx context.Context) (layers.Layer, error) {
	bb := m.cfg.BusyboxPath
	if err := checkStatic(bb); err != nil {
		return layers.Layer{}, err
	}
	out, err := exec.CommandContext(ctx, bb, "--list-full").Output()
	if err != nil {
		return layers.Layer{}, fmt.Errorf("busybox --list-full: %w", err)
	}
	scratch, err := m.cfg.Layers.TempDir("busybox-")
	if err != nil {
		return layers.Layer{}, err
	}
	defer os.RemoveAll(scratch)
	root := filepath.Join(scratch, "rootfs")

	dirs := []struct {
		path string
		mode fs.FileMode
	}{
		{".", 0o755}, {"bin", 0o755}, {"sbin", 0o755}, {"usr", 0o755}, {"usr/bin", 0o755},
		{"usr/sbin", 0o755}, {"etc", 0o755}, {"root", 0o700}, {"home", 0o755},
		{"tmp", 0o777 | fs.ModeSticky}, {"var", 0o755}, {"var/tmp", 0o777 | fs.ModeSticky},
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"run", 0o755},
		// The runner's mount point: present below, so that no sandbox's
		// upper dir gets a new inode for it.
		{".agentbox", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.path)
		if err := os.Mkdir(p, 0o700); err != nil {
			return layers.Layer{}, err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return layers.Layer{}, err
		}
	}
	if err := copyExecutable(bb, filepath.Join(root, "bin/busybox")); err != nil {
		return layers.Layer{}, err
	}
	applets := map[string]bool{}
	for _, line := range strings.Fields(string(out)) {
		rel := filepath.Clean(strings.TrimPrefix(line, "/"))
		if rel == "bin/busybox" || strings.HasPrefix(rel, "..") || !strings.Contains(rel, "/") {
			continue
		}
		applets[rel] = true
	}
	if !applets["bin/sh"] {
		return layers.Layer{}, fmt.Errorf("busybox %s has no sh applet: %w", bb, errdefs.ErrFailedPrecondition)
	}
	applets["usr/bin/env"] = true
	for rel := range applets {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return layers.Layer{}, err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil && !errors.Is(err, fs.ErrExist) {
			return layers.Layer{}, err
		}
	}
	files := map[string]string{
		"etc/passwd":     "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":      "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":      "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"etc/shells":     "/bin/sh\n/bin/ash\n",
		"etc/profile":    "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
		"etc/os-release": "NAME=\"agentbox busybox\"\nID=busybox\n",
	}
	for rel, content := range files {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(content), 0o644); err != nil {
			return layers.Layer{}, err
		}
		if err := os.Chmod(filepath.Join(root, rel), 0o644); err != nil {
			return layers.Layer{}, err
		}
	}
	uid := int(m.cfg.IDs.HostID)
	if err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	}); err != nil {
		return layers.Layer{}, fmt.Errorf("busybox base: %w", err)
	}
	return m.cfg.Layers.CreateFromDir(ctx, root, layers.CreateOptions{})
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(0o755); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// debianKey is the cache key of a Debian base. It does not change when the
// mirror publishes updates: rebuild with Force to refresh.
func (m *Manager) debianKey(b base) string {
	return hashStrings("base", "debian", b.suite, strings.Join(b.packages, ","), m.cfg.DebianMirror)
}

// buildDebian runs mmdebstrap and streams its tar output into a new layer.
// mmdebstrap's stderr becomes build log lines.
func (m *Manager) buildDebian(ctx context.Context, b base, logw io.Writer) (layers.Layer, error) {
	bin, err := exec.LookPath(m.cfg.Mmdebstrap)
	if err != nil {
		return layers.Layer{}, fmt.Errorf("debian base needs mmdebstrap (apt-get install mmdebstrap): %w: %w", errdefs.ErrFailedPrecondition, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	args := []string{"--variant=minbase", "--format=tar"}
	if len(b.packages) > 0 {
		args = append(args, "--include="+strings.Join(b.packages, ","))
	}
	args = append(args, b.suite, "-")
	if m.cfg.DebianMirror != "" {
		args = append(args, m.cfg.DebianMirror)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var tail tailBuffer
	cmd.Stderr = io.MultiWriter(logw, &tail)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return layers.Layer{}, err
	}
	if err := cmd.Start(); err != nil {
		return layers.Layer{}, fmt.Errorf("starting mmdebstrap: %w", err)
	}
	l, ierr := m.cfg.Layers.ImportTar(ctx, stdout, layers.CreateOptions{})
	if ierr != nil {
		cancel() // stop mmdebstrap before waiting for it
		_, _ = io.Copy(io.Discard, stdout)
	}
	werr := cmd.Wait()
	switch {
	case werr != nil && ctx.Err() == nil:
		// mmdebstrap failed; the import may have seen a truncated stream.
		if ierr == nil {
			if rerr := m.cfg.Layers.Remove(context.WithoutCancel(ctx), l.ID); rerr != nil && !errdefs.IsConflict(rerr) {
				m.log.Warn("removing layer of failed mmdebstrap", "layer", l.ID, "err", rerr)
			}
		}
		return layers.Layer{}, fmt.Errorf("mmdebstrap %s: %w (%s)", b, werr, tail.last())
	case ierr != nil:
		return layers.Layer{}, fmt.Errorf("importing mmdebstrap output: %w", ierr)
	}
	return l, nil
}

// tailBuffer keeps the last lines written to it, for error messages.
type tailBuffer struct {
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf.Write(p)
	if t.buf.Len() > 4096 {
		b := t.buf.Bytes()[t.buf.Len()-2048:]
		t.buf.Reset()
		t.buf.Write(b)
	}
	return len(p), nil
}

func (t *tailBuffer) last() string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(t.buf.Bytes()))
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" {
			lines = append(lines, s)
		}
	}
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, "; ")
}
