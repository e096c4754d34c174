package gvisor

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// PinnedVersion is the gVisor module version scripts/install-deps.sh
// builds runsc at (statically: CGO_ENABLED=0; a cgo build cannot start its
// sandbox, which re-executes itself in an empty chroot with no dynamic
// loader).
const PinnedVersion = "v0.0.0-20260905035102-160fafc42237"

// InstallHint says how to get runsc; errors about a missing runsc end with it.
const InstallHint = "install it with scripts/install-deps.sh (builds runsc " + PinnedVersion +
	" into ${XDG_CACHE_HOME:-$HOME/.cache}/agentbox/runsc-" + PinnedVersion + "/runsc) or pass --runsc PATH"

// CachedPath is where scripts/install-deps.sh puts runsc:
// ${XDG_CACHE_HOME:-$HOME/.cache}/agentbox/runsc-<PinnedVersion>/runsc
// ("" when neither variable is set).
func CachedPath() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home := os.Getenv("HOME")
		if home == "" {
			return ""
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "agentbox", "runsc-"+PinnedVersion, "runsc")
}

// FindRunsc returns the runsc binary to use: path when not empty (it must
// exist), else CachedPath, else "runsc" on $PATH. It fails with
// errdefs.ErrFailedPrecondition, saying how to install it, when there is
// none.
func FindRunsc(path string) (string, error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("runsc %s: %v: %w; %s", path, err, errdefs.ErrFailedPrecondition, InstallHint)
		}
		return path, nil
	}
	if p := CachedPath(); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("gVisor's runsc is not installed: %w; %s", errdefs.ErrFailedPrecondition, InstallHint)
}

// runscVersion reads the gVisor module version runsc was built from (its
// Go build info: `runsc --version` says VERSION_MISSING for a binary built
// with go install), without running it.
func runscVersion(path string) string {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	if info.Main.Path == "gvisor.dev/gvisor" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == "gvisor.dev/gvisor" {
			return d.Version
		}
	}
	return "unknown"
}

// choosePlatform resolves the platform setting: "" is systrap, which
// needs no device. kvm is faster where it works, but is used only when
// asked for: a /dev/kvm that opens is not one that works (a nested
// hypervisor may refuse the sentry's vCPU setup, as on the CI machine,
// where the sandbox then dies at start). ptrace is the fallback for a host
// whose kernel refuses systrap.
func choosePlatform(p string) (string, error) {
	switch p {
	case "systrap", "ptrace", "kvm":
		return p, nil
	case "":
		return "systrap", nil
	}
	return "", fmt.Errorf("gvisor platform %q (want systrap, ptrace or kvm): %w", p, errdefs.ErrInvalidArgument)
}

// runsc runs the runsc binary with the backend's global flags and args,
// returning its combined output in the error when it fails.
func (b *Backend) runsc(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, b.runscPath, append(b.globalFlags(), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2048 {
			msg = msg[len(msg)-2048:]
		}
		return stdout.Bytes(), &runscError{args: args, msg: msg, err: err}
	}
	return stdout.Bytes(), nil
}

// globalFlags are given to every runsc command: the state root, the
// platform, no network but the sentry's loopback, no overlay of runsc's
// own over the root filesystem (writes go to the sandbox's upper dir), and
// host unix sockets created by bind(2) (the guest's listener; see gvinit).
func (b *Backend) globalFlags() []string {
	return []string{
		"--root=" + filepath.Join(b.root, "runsc"),
		"--platform=" + b.platform,
		"--network=none",
		"--overlay2=none",
		"--host-uds=create",
	}
}

// runscError is a failed runsc command.
type runscError struct {
	args []string
	msg  string
	err  error
}

func (e *runscError) Error() string {
	cmd := "runsc"
	if len(e.args) > 0 {
		cmd += " " + e.args[0]
	}
	if e.msg == "" {
		return cmd + ": " + e.err.Error()
	}
	return cmd + ": " + e.err.Error() + ": " + e.msg
}

func (e *runscError) Unwrap() error { return e.err }

// notExist reports whether err says the container does not exist.
func notExist(err error) bool {
	var re *runscError
	return errors.As(err, &re) && (strings.Contains(re.msg, "does not exist") || strings.Contains(re.msg, "not found"))
}
