// Package runner stages and validates guest binaries ("runners").
//
// The guest that runs as PID 1 in every sandbox is an agentbox binary kept
// in a content-addressed, read-only runner directory (<root>/<sha256[:16]>/
// agentbox, mode 0555, owned by host root) and bind-mounted read-only at
// /.agentbox. The runner is never part of the user's layers: it changes at
// the platform's cadence, the user's files at the user's. Upgrading the
// guest of a sandbox (internal/sandbox, upgrade.go) points the sandbox at
// another runner directory; this package makes sure such a directory only
// ever holds a binary that passed its own self-check.
//
// A runner is identified three ways: its directory name (Hash, a prefix of
// the binary's sha256), its release Version, and its Build: the Go build
// ID's content part (a hash of the binary the Go linker records in it),
// which the guest reads from its own executable and reports with its
// version ("0.1.0+abcdef012345"), so two builds of one release are told
// apart without hashing megabytes at every guest start.
package runner

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// BinaryName is the runner binary's file name inside its directory.
const BinaryName = "agentbox"

// hashLen is the length of a runner directory name (hex sha256 prefix).
const hashLen = 16

// buildLen is how much of a build id a guest version carries.
const buildLen = 12

var hashRE = lazyregexp.New(`^[0-9a-f]{16}$`)

// ValidHash reports whether h has the form of a runner directory name.
func ValidHash(h string) bool { return hashRE.MatchString(h) }

// GuestVersion is the version string a guest of build build reports:
// "<version>+<build>".
func GuestVersion(version, build string) string {
	if build == "" {
		return version
	}
	return version + "+" + build
}

// maxBinary bounds what is read of a binary under inspection.
const maxBinary = 512 << 20

// CheckStatic returns nil when the file at path is an ELF executable for
// this machine's architecture with no program interpreter and no dynamic
// section: a statically linked binary that runs in a sandbox root holding
// no loader or libraries of ours. The file is untrusted input.
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("the binary is not an ELF executable: %w", errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("the binary is an ELF %v, not an executable: %w", f.Type, errdefs.ErrInvalidArgument)
	}
	if want, ok := elfMachines[runtime.GOARCH]; ok && f.Machine != want {
		return fmt.Errorf("the binary is built for %v, this machine is %s: %w", f.Machine, runtime.GOARCH, errdefs.ErrInvalidArgument)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			return fmt.Errorf("the binary is dynamically linked (build it with CGO_ENABLED=0): %w", errdefs.ErrInvalidArgument)
		}
	}
	// Linked statically, a cgo build still cannot serve: the guest sets
	// its security posture on every thread with syscall.AllThreadsSyscall,
	// which fails (ENOTSUP) in a binary that uses cgo.
	if bi, err := buildinfo.ReadFile(path); err == nil {
		for _, st := range bi.Settings {
			if st.Key == "CGO_ENABLED" && st.Value == "1" {
				return fmt.Errorf("the binary was built with cgo (build it with CGO_ENABLED=0): %w", errdefs.ErrInvalidArgument)
			}
		}
	}
	return nil
}

var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386,
	"arm": elf.EM_ARM, "riscv64": elf.EM_RISCV, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390,
}

// Build returns the short build identity of the binary at path: the
// content part of its Go build ID (the note the Go linker writes), or,
// for a binary without one, a prefix of its sha256. The guest computes
// the same from /proc/self/exe.
func Build(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading build id: %w", err)
	}
	defer f.Close()
	if id := goBuildID(f); id != "" {
		parts := strings.Split(id, "/")
		content := parts[len(parts)-1]
		if len(content) > buildLen {
			content = content[:buildLen]
		}
		if content != "" {
			return content, nil
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("reading build id: %w", err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, maxBinary)); err != nil {
		return "", fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil))[:buildLen], nil
}

// goBuildID returns the Go build ID recorded in the ELF note
// ".note.go.buildid" of f, or "".
func goBuildID(f *os.File) string {
	ef, err := elf.NewFile(f)
	if err != nil {
		return ""
	}
	sec := ef.Section(".note.go.buildid")
	if sec == nil || sec.Size > 4096 {
		return ""
	}
	data, err := sec.Data()
	if err != nil || len(data) < 16 {
		return ""
	}
	// An ELF note: namesz, descsz, type (4 bytes each, the file's byte
	// order), then the name "Go\0\0" and the description: the build ID.
	bo := ef.ByteOrder
	namesz, descsz, typ := bo.Uint32(data[0:]), bo.Uint32(data[4:]), bo.Uint32(data[8:])
	if namesz != 4 || typ != 4 || !bytes.Equal(data[12:16], []byte("Go\x00\x00")) || uint64(descsz) > uint64(len(data)-16) {
		return ""
	}
	id := string(data[16 : 16+descsz])
	if !buildIDRE.MatchString(id) {
		return ""
	}
	return id
}

var buildIDRE = lazyregexp.New(`^[A-Za-z0-9_/-]{1,256}$`)
