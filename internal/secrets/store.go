package secrets

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/google/renameio/v2"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// Limits on stored secrets.
const (
	MaxValueBytes = 64 << 10
	maxSecrets    = 4096
)

// NameRE is the shape of a stored secret name: a tenant's secrets are
// stored as "<tenant>~<name>" (internal/tenant.Qualify), the admin's as
// "<name>". Clients only ever give the unqualified part.
var NameRE = lazyregexp.New(`^([a-z0-9][a-z0-9-]{0,31}~)?[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

const (
	purposeStore = "agentbox secrets store v1"
	checkPlain   = "agentbox secrets key check"
	checkAAD     = "check"
	fileVersion  = 1
)

// Value is a secret's plaintext. Its String and LogValue never show it, so
// a value that slips into a log line or an error prints as [REDACTED].
type Value []byte

// String implements fmt.Stringer without revealing the value.
func (Value) String() string { return "[REDACTED]" }

// GoString implements fmt.GoStringer without revealing the value.
func (Value) GoString() string { return "[REDACTED]" }

// LogValue implements slog.LogValuer without revealing the value.
func (Value) LogValue() slog.Value { return slog.StringValue("[REDACTED]") }

// Store is the encrypted secret store: one JSON file (mode 0600) in the data
// dir holding, per secret, its name, times and the AES-256-GCM sealed value
// (fresh random nonce per write; the name is the additional data, so a
// ciphertext moved to another name does not open). The file also holds a
// sealed check value, so opening with the wrong key fails at once instead of
// at first use. Every write replaces the file atomically.
//
// Methods are safe for concurrent use.
type Store struct {
	path string
	aead cipher.AEAD

	// mu guards the fields below and serialises writes of the file.
	mu   sync.Mutex
	file storeFile
}

type storeFile struct {
	Version int              `json:"version"`
	Check   []byte           `json:"check"`
	Secrets map[string]entry `json:"secrets"`
}

type entry struct {
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	Sealed    []byte    `json:"sealed"` // nonce || ciphertext+tag
}

// OpenStore opens (creating if missing) the store file at path with the
// master key. A store written under another key fails with an error
// wrapping errdefs.ErrPermissionDenied.
func OpenStore(path string, key Key) (*Store, error) {
	block, err := aes.NewCipher(key.Derive(purposeStore))
	if err != nil {
		return nil, fmt.Errorf("opening secret store: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("opening secret store: %w", err)
	}
	s := &Store{path: path, aead: aead}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.file = storeFile{Version: fileVersion, Check: s.seal([]byte(checkPlain), checkAAD), Secrets: map[string]entry{}}
		if err := s.saveLocked(); err != nil {
			return nil, err
		}
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("opening secret store: %w", err)
	}
	if err := json.Unmarshal(data, &s.file); err != nil {
		return nil, fmt.Errorf("opening secret store %s: undecodable: %v: %w", path, err, errdefs.ErrInternal)
	}
	if s.file.Version != fileVersion {
		return nil, fmt.Errorf("opening secret store %s: version %d, this build reads %d: %w", path, s.file.Version, fileVersion, errdefs.ErrFailedPrecondition)
	}
	if pt, err := s.open(s.file.Check, checkAAD); err != nil || string(pt) != checkPlain {
		return nil, fmt.Errorf("opening secret store %s: the secrets key does not match the one the store was written with: %w", path, errdefs.ErrPermissionDenied)
	}
	if s.file.Secrets == nil {
		s.file.Secrets = map[string]entry{}
	}
	return s, nil
}

func (s *Store) seal(plain []byte, aad string) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	_, _ = rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, plain, []byte(aad))
}

func (s *Store) open(sealed []byte, aad string) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return nil, fmt.Errorf("sealed value too short: %w", errdefs.ErrInternal)
	}
	pt, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(aad))
	if err != nil {
		return nil, fmt.Errorf("sealed value does not open: %w", errdefs.ErrInternal)
	}
	return pt, nil
}

func entryAAD(name string) string { return "secret:" + name }

// saveLocked writes the file atomically. s.mu must be held (or s not yet
// shared).
func (s *Store) saveLocked() error {
	data, err := json.Marshal(s.file)
	if err != nil {
		return fmt.Errorf("saving secret store: %w", err)
	}
	if err := renameio.WriteFile(s.path, data, 0o600); err != nil {
		return fmt.Errorf("saving secret store: %w", err)
	}
	return nil
}

// ValidName reports whether name is a valid secret name, as an error
// wrapping errdefs.ErrInvalidArgument.
func ValidName(name string) error {
	if !NameRE.MatchString(name) {
		return fmt.Errorf("secret name %q is not valid (letters, digits, '_', '.', '-'; at most 128): %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Put stores value under name, replacing an earlier value.
func (s *Store) Put(ctx context.Context, name string, value []byte) (api.SecretInfo, error) {
	if err := ValidName(name); err != nil {
		return api.SecretInfo{}, err
	}
	if len(value) == 0 || len(value) > MaxValueBytes {
		return api.SecretInfo{}, fmt.Errorf("secret %s: value must be 1 to %d bytes: %w", name, MaxValueBytes, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return api.SecretInfo{}, fmt.Errorf("storing secret %s: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	old, exists := s.file.Secrets[name]
	if !exists && len(s.file.Secrets) >= maxSecrets {
		return api.SecretInfo{}, fmt.Errorf("at most %d secrets: %w", maxSecrets, errdefs.ErrResourceExhausted)
	}
	e := entry{CreatedAt: now, UpdatedAt: now, Sealed: s.seal(value, entryAAD(name))}
	if exists {
		e.CreatedAt = old.CreatedAt
	}
	s.file.Secrets[name] = e
	if err := s.saveLocked(); err != nil {
		if exists {
			s.file.Secrets[name] = old
		} else {
			delete(s.file.Secrets, name)
		}
		return api.SecretInfo{}, err
	}
	return api.SecretInfo{Name: name, CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt}, nil
}

// Secret returns the plaintext of name (ErrNotFound when missing). This is
// the one read path, for host-side consumers only; the shape is the one the
// egress proxy and the bridge depend on.
func (s *Store) Secret(ctx context.Context, name string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("reading secret %s: %w", name, err)
	}
	s.mu.Lock()
	e, ok := s.file.Secrets[name]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
	}
	v, err := s.open(e.Sealed, entryAAD(name))
	if err != nil {
		return nil, fmt.Errorf("reading secret %s: %w", name, err)
	}
	return v, nil
}

// List returns every secret's name and times, ordered by name.
func (s *Store) List(ctx context.Context) ([]api.SecretInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	s.mu.Lock()
	out := make([]api.SecretInfo, 0, len(s.file.Secrets))
	for name, e := range s.file.Secrets {
		out = append(out, api.SecretInfo{Name: name, CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt})
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Delete removes name (ErrNotFound when missing).
func (s *Store) Delete(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("deleting secret %s: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.file.Secrets[name]
	if !ok {
		return fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
	}
	delete(s.file.Secrets, name)
	if err := s.saveLocked(); err != nil {
		s.file.Secrets[name] = old
		return err
	}
	return nil
}
