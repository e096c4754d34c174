package secrets

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func testKey(t *testing.T) Key {
	t.Helper()
	b := make([]byte, KeySize)
	_, _ = rand.Read(b)
	k, err := KeyFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "etc", "secrets.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %o, want 600", fi.Mode().Perm())
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if k1 != k2 {
		t.Fatal("reloaded key differs")
	}
	if s := k1.String(); s != "[REDACTED]" {
		t.Fatalf("key prints as %q", s)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("world-readable key: %v, want permission denied", err)
	}
	if _, err := LoadOrCreateKey("relative/key"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("relative path: %v", err)
	}
	bad := filepath.Join(dir, "bad.key")
	if err := os.WriteFile(bad, []byte("not base64!"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(bad); err == nil {
		t.Fatal("garbage key file accepted")
	}
}

func TestStoreEncryptedAtRest(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "secrets.json")
	key := testKey(t)
	s, err := OpenStore(path, key)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte("ghp_supersecretvalue_0123456789")
	info, err := s.Put(ctx, "github", value)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "github" || info.CreatedAt.IsZero() {
		t.Fatalf("info %+v", info)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, form := range [][]byte{value, []byte(base64.StdEncoding.EncodeToString(value)), value[:12]} {
		if bytes.Contains(raw, form) {
			t.Fatalf("store file contains plaintext form %q", form)
		}
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("store mode %o", fi.Mode().Perm())
	}
	got, err := s.Secret(ctx, "github")
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Secret = %q, %v", got, err)
	}

	// Reopen with the same key: value survives; with another key: refused.
	s2, err := OpenStore(path, key)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s2.Secret(ctx, "github"); err != nil || !bytes.Equal(got, value) {
		t.Fatalf("after reopen: %q, %v", got, err)
	}
	if _, err := OpenStore(path, testKey(t)); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("wrong key: %v, want permission denied", err)
	}

	// A ciphertext moved to another name does not open (name is the AAD).
	s2.mu.Lock()
	e := s2.file.Secrets["github"]
	s2.file.Secrets["other"] = e
	s2.mu.Unlock()
	if _, err := s2.Secret(ctx, "other"); err == nil {
		t.Fatal("ciphertext swapped between names opened")
	}
}

func TestStoreCRUD(t *testing.T) {
	ctx := context.Background()
	s, err := OpenStore(filepath.Join(t.TempDir(), "s.json"), testKey(t))
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Put(ctx, "b", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "a", []byte("2")); err != nil {
		t.Fatal(err)
	}
	upd, err := s.Put(ctx, "b", []byte("3"))
	if err != nil {
		t.Fatal(err)
	}
	if !upd.CreatedAt.Equal(first.CreatedAt) || upd.UpdatedAt.Before(first.UpdatedAt) {
		t.Fatalf("update times: %+v after %+v", upd, first)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "a" || list[1].Name != "b" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if v, _ := s.Secret(ctx, "b"); string(v) != "3" {
		t.Fatalf("updated value %q", v)
	}
	if err := s.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Secret(ctx, "b"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted secret: %v", err)
	}
	if err := s.Delete(ctx, "b"); !errdefs.IsNotFound(err) {
		t.Fatalf("double delete: %v", err)
	}
	for _, name := range []string{"", "../x", "a b", "-x", string(make([]byte, 200))} {
		if _, err := s.Put(ctx, name, []byte("v")); !errdefs.IsInvalidArgument(err) {
			t.Errorf("name %q: %v", name, err)
		}
	}
	if _, err := s.Put(ctx, "empty", nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty value: %v", err)
	}
	if _, err := s.Put(ctx, "big", make([]byte, MaxValueBytes+1)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("big value: %v", err)
	}
}

func TestValueNeverPrints(t *testing.T) {
	v := Value("hunter2")
	for _, s := range []string{v.String(), v.GoString(), v.LogValue().String()} {
		if bytes.Contains([]byte(s), []byte("hunter2")) {
			t.Fatalf("value printed: %q", s)
		}
	}
}
