package store

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestCheckpointRecordsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "meta.db")
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetCheckpoint(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("get before any put: %v", err)
	}
	if list, err := b.ListCheckpoints(ctx); err != nil || len(list) != 0 {
		t.Fatalf("empty list: %v %v", list, err)
	}
	rec := CheckpointRecord{Checkpoint: api.Checkpoint{ID: "c1", Name: "before", SandboxID: "s1", Layers: []string{"a", "b"}}, Layer: "a", Env: map[string]string{"K": "V"}}
	if err := b.PutCheckpoint(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := b.PutCheckpoint(ctx, CheckpointRecord{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty id: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, err := b.GetCheckpoint(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Checkpoint.Name != "before" || got.Layer != "a" || got.Env["K"] != "V" || len(got.Checkpoint.Layers) != 2 {
		t.Fatalf("record changed across reopen: %+v", got)
	}
	if err := b.DeleteCheckpoint(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteCheckpoint(ctx, "c1"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if list, _ := b.ListCheckpoints(ctx); len(list) != 0 {
		t.Fatalf("list after delete: %v", list)
	}
}
