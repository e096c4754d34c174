package store

import (
	"context"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/agentbox/agentbox/api"
)

func TestQuarantineCorrupt(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.PutSandbox(ctx, SandboxRecord{Sandbox: api.Sandbox{ID: "good"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutCheckpoint(ctx, CheckpointRecord{Checkpoint: api.Checkpoint{ID: "cp"}}); err != nil {
		t.Fatal(err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSandboxes).Put([]byte("torn"), []byte(`{"sandbox":{"id":"to`)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketSandboxes).Put([]byte("moved"), []byte(`{"sandbox":{"id":"other"}}`)); err != nil {
			return err
		}
		return tx.Bucket(bucketCheckpoints).Put([]byte("cpbad"), []byte(`[]`))
	})
	if err != nil {
		t.Fatal(err)
	}
	moved, err := s.QuarantineCorrupt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range moved {
		got[r.Bucket+"/"+r.Key] = true
	}
	for _, want := range []string{"sandboxes/torn", "sandboxes/moved", "checkpoints/cpbad"} {
		if !got[want] {
			t.Errorf("%s not quarantined: %v", want, moved)
		}
	}
	if len(moved) != 3 {
		t.Errorf("quarantined %d records, want 3: %v", len(moved), moved)
	}
	recs, _ := s.ListSandboxes(ctx)
	if len(recs) != 1 || recs[0].Sandbox.ID != "good" {
		t.Errorf("sandboxes after quarantine: %+v", recs)
	}
	if _, err := s.GetCheckpoint(ctx, "cp"); err != nil {
		t.Errorf("good checkpoint lost: %v", err)
	}
	if _, err := s.GetSandbox(ctx, "torn"); err == nil {
		t.Error("torn record still in the sandboxes bucket")
	}
	q, err := s.ListQuarantine(ctx)
	if err != nil || len(q) != 3 {
		t.Fatalf("ListQuarantine = %d records, %v", len(q), err)
	}
	for _, r := range q {
		if r.Key == "torn" && string(r.Raw) != `{"sandbox":{"id":"to` {
			t.Errorf("raw bytes not kept: %q", r.Raw)
		}
	}
	// A second pass finds nothing more.
	if again, err := s.QuarantineCorrupt(ctx); err != nil || len(again) != 0 {
		t.Errorf("second pass: %v, %v", again, err)
	}
}
