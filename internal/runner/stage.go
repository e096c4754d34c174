package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
)

// Report is what `agentbox guest selfcheck` prints on stdout, as one JSON
// object: the binary checked it is statically linked, that it can parse a
// sandbox config and assemble its seccomp policy, and says who it is.
type Report struct {
	Version string `json:"version"`
	// Build is the binary's own build identity (see Build).
	Build string `json:"build"`
	// Protocol is the host<->guest protocol version it speaks.
	Protocol int `json:"protocol"`
	// Setup is the version of the guest's setup protocol
	// (nsinit.SetupVersion); absent in runners that predate it.
	Setup  int  `json:"setup,omitempty"`
	Static bool `json:"static"`
	// SeccompInstructions is the length of its assembled seccomp program.
	SeccompInstructions int `json:"seccomp_instructions"`
}

// Runner is a staged, validated runner directory.
type Runner struct {
	Hash    string // directory name: sha256 prefix of the binary
	Dir     string // <root>/<Hash>, holding BinaryName
	Version string // release version the binary reported
	Build   string // build identity (see Build)
}

// GuestVersion is the version a guest of r reports.
func (r Runner) GuestVersion() string { return GuestVersion(r.Version, r.Build) }

// Store is the directory of runner directories (<data>/runner). Staging
// and validating are safe for concurrent use; directories are immutable
// once renamed into place and are never removed while the daemon runs.
type Store struct {
	// Root holds the runner directories (host root only: the self-check
	// is executed through a descriptor).
	Root string
	// UID and GID are the unprivileged host ids the self-check runs as,
	// unless Lease is set.
	UID, GID uint32
	// Lease, when set, returns the unprivileged host id (uid and gid) one
	// self-check runs as, and a release called once it has exited (a
	// host id range of its own, as a sandbox gets).
	Lease func() (id uint32, release func(), err error)
	// Timeout bounds one self-check (default 10s).
	Timeout time.Duration
}

// DefaultSelfCheckTimeout bounds a self-check when Store.Timeout is zero.
const DefaultSelfCheckTimeout = 10 * time.Second

// Dir returns the directory of runner hash (which need not exist).
func (s *Store) Dir(hash string) string { return filepath.Join(s.Root, hash) }

// StageFile stages the binary at path (see Stage).
func (s *Store) StageFile(ctx context.Context, path string) (Runner, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Runner{}, fmt.Errorf("staging runner: %s does not exist: %w", path, errdefs.ErrInvalidArgument)
		}
		return Runner{}, fmt.Errorf("staging runner: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return Runner{}, fmt.Errorf("staging runner: %s is not a regular file: %w", path, errdefs.ErrInvalidArgument)
	}
	return s.Stage(ctx, f)
}

// Stage copies the binary read from src into a temporary directory under
// Root (mode 0555, fsynced), validates it there (Validate) and only then
// renames the directory into place as Root/<hash>. A binary that fails
// validation leaves nothing behind. Staging a binary that is already in
// place validates it again and returns the existing directory.
func (s *Store) Stage(ctx context.Context, src io.Reader) (_ Runner, err error) {
	if err := os.MkdirAll(s.Root, 0o755); err != nil {
		return Runner{}, fmt.Errorf("staging runner: %w", err)
	}
	tmp, err := os.MkdirTemp(s.Root, ".stage-")
	if err != nil {
		return Runner{}, fmt.Errorf("staging runner: %w", err)
	}
	defer func() {
		if tmp != "" {
			_ = os.RemoveAll(tmp)
		}
	}()
	bin := filepath.Join(tmp, BinaryName)
	dst, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return Runner{}, fmt.Errorf("staging runner: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(dst, h), io.LimitReader(src, maxBinary+1))
	if err == nil && n > maxBinary {
		err = fmt.Errorf("runner binary is larger than %d bytes: %w", maxBinary, errdefs.ErrTooLarge)
	}
	if err == nil && n == 0 {
		err = fmt.Errorf("runner binary is empty: %w", errdefs.ErrInvalidArgument)
	}
	if err == nil {
		err = dst.Chmod(0o555)
	}
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Runner{}, fmt.Errorf("staging runner: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Runner{}, fmt.Errorf("staging runner: %w", err)
	}
	hash := hex.EncodeToString(h.Sum(nil))[:hashLen]
	rep, err := s.Validate(ctx, bin)
	if err != nil {
		return Runner{}, fmt.Errorf("staging runner %s: %w", hash, err)
	}
	r := Runner{Hash: hash, Dir: s.Dir(hash), Version: rep.Version, Build: rep.Build}
	if _, err := os.Stat(filepath.Join(r.Dir, BinaryName)); err == nil {
		return r, nil // already staged; identical content
	}
	if err := os.Rename(tmp, r.Dir); err != nil {
		if _, serr := os.Stat(filepath.Join(r.Dir, BinaryName)); serr == nil {
			return r, nil // lost a race with another stager
		}
		return Runner{}, fmt.Errorf("staging runner: %w", err)
	}
	tmp = ""
	if d, err := os.Open(s.Root); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return r, nil
}

// Open validates the runner directory hash already in place and returns
// it: ErrNotFound when there is none.
func (s *Store) Open(ctx context.Context, hash string) (Runner, error) {
	if !ValidHash(hash) {
		return Runner{}, fmt.Errorf("runner %q: want 16 hex digits: %w", hash, errdefs.ErrInvalidArgument)
	}
	bin := filepath.Join(s.Dir(hash), BinaryName)
	if _, err := os.Stat(bin); err != nil {
		return Runner{}, fmt.Errorf("runner %s: %w", hash, errdefs.ErrNotFound)
	}
	rep, err := s.Validate(ctx, bin)
	if err != nil {
		return Runner{}, fmt.Errorf("runner %s: %w", hash, err)
	}
	return Runner{Hash: hash, Dir: s.Dir(hash), Version: rep.Version, Build: rep.Build}, nil
}

// List returns the hashes of the runner directories in place.
func (s *Store) List() ([]string, error) {
	ents, err := os.ReadDir(s.Root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing runners: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && ValidHash(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Validate checks the binary at bin before any sandbox runs it: it must
// be a static ELF executable for this machine, and `bin guest selfcheck`,
// run locked down (as UID/GID with no supplementary groups, empty
// environment, cwd /, in fresh network, mount, pid, ipc and uts
// namespaces, so with no network at all; killed after Timeout), must exit
// 0 and print exactly one well-formed Report whose build matches the one
// read from the file and whose protocol is ours. Anything else is refused
// with ErrInvalidArgument; the binary's output is only quoted, clipped.
func (s *Store) Validate(ctx context.Context, bin string) (Report, error) {
	if err := CheckStatic(bin); err != nil {
		return Report{}, err
	}
	build, err := Build(bin)
	if err != nil {
		return Report{}, err
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultSelfCheckTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	uid, gid := s.UID, s.GID
	if s.Lease != nil {
		id, release, err := s.Lease()
		if err != nil {
			return Report{}, fmt.Errorf("self-check: %w", err)
		}
		defer release()
		uid, gid = id, id
	}
	// Executed through a descriptor: its uid cannot traverse the data dir.
	exe, err := os.Open(bin)
	if err != nil {
		return Report{}, fmt.Errorf("self-check: %w", err)
	}
	defer exe.Close()
	var stdout, stderr capped
	stdout.max, stderr.max = 64<<10, 4<<10
	cmd := exec.CommandContext(ctx, "/proc/self/fd/3", "guest", "selfcheck")
	cmd.Args[0] = BinaryName
	cmd.ExtraFiles = []*os.File{exe}
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}},
		Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
	// Killing the pid namespace's init kills everything it started.
	runErr := cmd.Run()
	if ctx.Err() != nil {
		return Report{}, fmt.Errorf("self-check did not finish within %v: %w", timeout, errdefs.ErrInvalidArgument)
	}
	if runErr != nil {
		var ee *exec.ExitError
		if errors.As(runErr, &ee) {
			return Report{}, fmt.Errorf("self-check failed (%v): %q: %w", ee.ProcessState, clip(stderr.String(), 300), errdefs.ErrInvalidArgument)
		}
		return Report{}, fmt.Errorf("running self-check: %v: %w", runErr, errdefs.ErrInvalidArgument)
	}
	rep, err := parseReport(stdout.Bytes())
	if err != nil {
		return Report{}, err
	}
	if rep.Build != build {
		return Report{}, fmt.Errorf("self-check reports build %q, the file is build %q: %w", clip(rep.Build, 40), build, errdefs.ErrInvalidArgument)
	}
	return rep, nil
}

// parseReport decodes and checks a self-check's output: one JSON object
// and nothing else.
func parseReport(out []byte) (Report, error) {
	bad := func(why string) error {
		return fmt.Errorf("self-check printed %s: %q: %w", why, clip(string(out), 200), errdefs.ErrInvalidArgument)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	var rep Report
	if err := dec.Decode(&rep); err != nil {
		return Report{}, bad("no report")
	}
	if _, err := dec.Token(); err != io.EOF {
		return Report{}, bad("more than one report")
	}
	switch {
	case rep.Version == "" || len(rep.Version) > 128 || !printable(rep.Version):
		return Report{}, bad("an invalid version")
	case rep.Build == "" || len(rep.Build) > 64 || !printable(rep.Build):
		return Report{}, bad("an invalid build")
	case rep.Protocol != proto.Version:
		return Report{}, fmt.Errorf("the runner speaks guest protocol %d, this daemon %d: %w", rep.Protocol, proto.Version, errdefs.ErrInvalidArgument)
	case rep.Setup != nsinit.SetupVersion:
		return Report{}, fmt.Errorf("the runner speaks guest setup protocol %d, this daemon %d (it cannot start it): %w", rep.Setup, nsinit.SetupVersion, errdefs.ErrInvalidArgument)
	case !rep.Static:
		return Report{}, bad("that it is not statically linked")
	case rep.SeccompInstructions <= 0:
		return Report{}, bad("no seccomp program")
	}
	return rep, nil
}

func printable(s string) bool {
	for _, r := range s {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' {
			return false
		}
	}
	return true
}

func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// capped is a buffer that keeps the first max bytes written to it and
// discards the rest (a runaway self-check cannot fill the daemon's memory).
type capped struct {
	bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); room > 0 {
		if len(p) > room {
			c.Buffer.Write(p[:room])
		} else {
			c.Buffer.Write(p)
		}
	}
	return len(p), nil
}
