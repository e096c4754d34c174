// Package secrets is the daemon's host-side secret store and the minting and
// verification of per-run bridge tokens.
//
// Everything here is keyed by one master key kept OUTSIDE the data directory
// (default /etc/agentbox/secrets.key): a copy of the data dir (a backup, a
// leaked volume) holds only ciphertext. Purpose-bound subkeys are derived
// from the master key with HKDF-SHA256, so the encryption key of the store
// and the signing key of run tokens are never the same bytes.
//
// Secret values are write-only through the API: the store returns them only
// to host-side consumers (the sandbox Manager placing a value into one
// process's environment, the egress proxy and the API bridge attaching a
// credential to an upstream request). They are never logged: Value's
// String and LogValue print a redacted form.
package secrets

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// KeySize is the size of the master key in bytes.
const KeySize = 32

// Key is the master key. Derive purpose-bound subkeys with Derive.
type Key struct{ b [KeySize]byte }

// String never shows the key.
func (Key) String() string { return "[REDACTED]" }

// Derive returns a 32-byte subkey for purpose (an HKDF "info" string).
func (k Key) Derive(purpose string) []byte {
	out, err := hkdf.Key(sha256.New, k.b[:], nil, purpose, 32)
	if err != nil {
		panic(err) // only for lengths over 255*32
	}
	return out
}

// KeyFromBytes makes a key from exactly KeySize bytes (tests).
func KeyFromBytes(b []byte) (Key, error) {
	var k Key
	if len(b) != KeySize {
		return k, fmt.Errorf("secrets key must be %d bytes: %w", KeySize, errdefs.ErrInvalidArgument)
	}
	copy(k.b[:], b)
	return k, nil
}

// LoadOrCreateKey reads the master key from path (base64 text of KeySize
// bytes). When the file does not exist it is created with a fresh random
// key, mode 0600, its directory 0700 if missing. A key file readable or
// writable by group or others is refused: the key protects every secret.
func LoadOrCreateKey(path string) (Key, error) {
	var k Key
	if !filepath.IsAbs(path) {
		return k, fmt.Errorf("secrets key file %q must be an absolute path: %w", path, errdefs.ErrInvalidArgument)
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return createKey(path)
	}
	if err != nil {
		return k, fmt.Errorf("reading secrets key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return k, fmt.Errorf("reading secrets key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return k, fmt.Errorf("secrets key file %s is accessible by others (mode %#o); chmod 600 it: %w", path, fi.Mode().Perm(), errdefs.ErrPermissionDenied)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(raw) != KeySize {
		return k, fmt.Errorf("secrets key file %s: want base64 of %d bytes: %w", path, KeySize, errdefs.ErrInvalidArgument)
	}
	copy(k.b[:], raw)
	return k, nil
}

func createKey(path string) (Key, error) {
	var k Key
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return k, fmt.Errorf("creating secrets key: %w", err)
	}
	_, _ = rand.Read(k.b[:]) // crypto/rand never fails on Linux
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Lost a race with another process creating it: use theirs.
		return LoadOrCreateKey(path)
	}
	if err != nil {
		return k, fmt.Errorf("creating secrets key: %w", err)
	}
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(k.b[:]) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return k, fmt.Errorf("creating secrets key: %w", err)
	}
	return k, nil
}
