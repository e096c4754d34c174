package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

func openTemp(t *testing.T) (*Bolt, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sub", "meta.db")
	b, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, path
}

func record(id string) SandboxRecord {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	return SandboxRecord{
		Sandbox: api.Sandbox{
			ID: id, Template: "busybox", TemplateID: "sha256:abc", State: api.StateRunning,
			Env: map[string]string{"A": "1"}, Labels: map[string]string{"team": "x"},
			Resources: api.Resources{CPUs: 1.5, MemoryBytes: 1 << 30, PidsMax: 100},
			Hostname:  id, Backend: "native",
			CreatedAt: time.Date(2029, 1, 2, 3, 4, 5, 0, time.UTC), ExpiresAt: &exp,
		},
		RuntimeState: []byte{0, 1, 2, 0xff},
		Layers:       []string{"/l/2", "/l/1"},
		UpperDir:     "/u", WorkDir: "/w", SocketPath: "/s.sock", StateDir: "/st",
		Spec:      json.RawMessage(`{"k":"v"}`),
		UpdatedAt: time.Date(2029, 5, 5, 5, 5, 5, 0, time.UTC),
	}
}

func TestCRUD(t *testing.T) {
	ctx := context.Background()
	b, _ := openTemp(t)

	if _, err := b.GetSandbox(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("Get missing: got %v, want not found", err)
	}
	if err := b.PutSandbox(ctx, SandboxRecord{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Put empty id: got %v, want invalid argument", err)
	}
	want := record("sb-1")
	if err := b.PutSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err := b.GetSandbox(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	wj, _ := json.Marshal(want)
	gj, _ := json.Marshal(got)
	if !bytes.Equal(wj, gj) {
		t.Fatalf("round trip mismatch:\n got %s\nwant %s", gj, wj)
	}

	// Replace.
	want.Sandbox.State = api.StateStopped
	want.UpdatedAt = time.Time{}
	if err := b.PutSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, _ = b.GetSandbox(ctx, "sb-1")
	if got.Sandbox.State != api.StateStopped || got.UpdatedAt.IsZero() {
		t.Fatalf("replace: state %q updated %v", got.Sandbox.State, got.UpdatedAt)
	}

	if err := b.PutSandbox(ctx, record("sb-0")); err != nil {
		t.Fatal(err)
	}
	list, err := b.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Sandbox.ID != "sb-0" || list[1].Sandbox.ID != "sb-1" {
		t.Fatalf("list: %+v", list)
	}

	if err := b.DeleteSandbox(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteSandbox(ctx, "sb-1"); err != nil {
		t.Fatalf("delete is not idempotent: %v", err)
	}
	if _, err := b.GetSandbox(ctx, "sb-1"); !errdefs.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.PutSandbox(cctx, record("sb-9")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
}

func TestReopenPersists(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "meta.db")
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.PutSandbox(ctx, record("keep")); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSandbox(ctx, "keep"); !errdefs.IsUnavailable(err) {
		t.Fatalf("use after close: got %v, want unavailable", err)
	}
	b2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	got, err := b2.GetSandbox(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.RuntimeState) != string(record("keep").RuntimeState) || got.Sandbox.ExpiresAt == nil {
		t.Fatalf("reopened record differs: %+v", got)
	}
}

func TestSecondOpenFailsFast(t *testing.T) {
	_, path := openTemp(t)
	start := time.Now()
	b2, err := Open(path, WithOpenTimeout(200*time.Millisecond))
	if err == nil {
		b2.Close()
		t.Fatal("second Open of a locked store succeeded")
	}
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("second Open: %v, want unavailable naming the lock", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("second Open took %v", d)
	}
}

func TestConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	b, _ := openTemp(t)
	const writers, each = 8, 20
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				if err := b.PutSandbox(ctx, record(id)); err != nil {
					t.Error(err)
					return
				}
				if _, err := b.GetSandbox(ctx, id); err != nil {
					t.Error(err)
				}
				if _, err := b.ListSandboxes(ctx); err != nil {
					t.Error(err)
				}
				if i%2 == 1 {
					if err := b.DeleteSandbox(ctx, id); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	list, err := b.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != writers*each/2 {
		t.Fatalf("got %d records, want %d", len(list), writers*each/2)
	}
}

func TestCorruptRecordSkipped(t *testing.T) {
	ctx := context.Background()
	var logBuf bytes.Buffer
	path := filepath.Join(t.TempDir(), "meta.db")
	b, err := Open(path, WithLogger(slog.New(slog.NewTextHandler(&logBuf, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.PutSandbox(ctx, record("good")); err != nil {
		t.Fatal(err)
	}
	err = b.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte("bad"), []byte("{not json"))
	})
	if err != nil {
		t.Fatal(err)
	}
	list, err := b.ListSandboxes(ctx)
	if err != nil {
		t.Fatalf("List with a corrupt record: %v", err)
	}
	if len(list) != 1 || list[0].Sandbox.ID != "good" {
		t.Fatalf("list: %+v", list)
	}
	if !strings.Contains(logBuf.String(), "id=bad") {
		t.Fatalf("corrupt record not logged: %q", logBuf.String())
	}
	if _, err := b.GetSandbox(ctx, "bad"); !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("Get corrupt: %v, want internal", err)
	}
}

// DeleteRuns deletes exactly the records its filter matches, durably.
func TestDeleteRuns(t *testing.T) {
	b, path := openTemp(t)
	ctx := context.Background()
	var runs []api.Run
	for i, tn := range []string{"acme", "beta", "acme", "", "acme"} {
		runs = append(runs, api.Run{ID: fmt.Sprintf("run_%02d", i), Tenant: tn, Trigger: api.TriggerAPI, State: api.RunFinished})
	}
	if err := b.PutRuns(ctx, runs); err != nil {
		t.Fatal(err)
	}
	n, err := b.DeleteRuns(ctx, RunFilter{Tenant: "acme"})
	if err != nil || n != 3 {
		t.Fatalf("DeleteRuns = %d, %v; want 3", n, err)
	}
	if n, err := b.DeleteRuns(ctx, RunFilter{Tenant: "acme"}); err != nil || n != 0 {
		t.Fatalf("second DeleteRuns = %d, %v", n, err)
	}
	_ = b.Close()
	b, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	left, err := b.ListRuns(ctx, RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || left[0].ID != "run_03" || left[1].ID != "run_01" {
		t.Errorf("left after reopening: %+v", left)
	}
}
