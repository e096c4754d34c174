package layergc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/testutil"
)

var ids = runtime.IDMap{HostID: 100000, Size: 65536}

type fakeSandboxes []string

func (f fakeSandboxes) LayersInUse(context.Context) ([]string, error) { return f, nil }

type fakeCheckpoints struct {
	store.CheckpointStore // unused methods panic
	recs                  []store.CheckpointRecord
}

func (f fakeCheckpoints) ListCheckpoints(context.Context) ([]store.CheckpointRecord, error) {
	return f.recs, nil
}

func layer(t *testing.T, ls *layers.Store, name string) layers.Layer {
	t.Helper()
	dir, err := ls.TempDir("src-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
		t.Fatal(err)
	}
	// Layer files are owned by the canonical range's root.
	for _, p := range []string{dir, filepath.Join(dir, name)} {
		if err := os.Lchown(p, int(ids.HostID), int(ids.HostID)); err != nil {
			t.Fatal(err)
		}
	}
	l, err := ls.CreateFromDir(context.Background(), dir, layers.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A collection keeps the layers sandboxes run on (LayersInUse: their
// directories), checkpoints' layers and referenced layers, and removes
// the rest.
func TestCollectGarbageKeepsRoots(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	ls, err := layers.New(filepath.Join(t.TempDir(), "layers"), ids)
	if err != nil {
		t.Fatal(err)
	}
	onSandbox, onCheckpoint, referenced, garbage := layer(t, ls, "s"), layer(t, ls, "c"), layer(t, ls, "r"), layer(t, ls, "g")
	if err := ls.Ref(ctx, referenced.ID, "template/t"); err != nil {
		t.Fatal(err)
	}
	c := New(ls, fakeSandboxes{onSandbox.Path}, fakeCheckpoints{recs: []store.CheckpointRecord{{Layer: onCheckpoint.ID}}})
	if c.StorageDriver() == "" {
		t.Error("no storage driver named")
	}
	res, err := c.CollectGarbage(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.RemovedLayers != 1 || res.Layers != 3 {
		t.Errorf("removed %d, kept %d; want 1 and 3", res.RemovedLayers, res.Layers)
	}
	var left []string
	for _, l := range ls.List() {
		left = append(left, l.ID)
	}
	for _, l := range []layers.Layer{onSandbox, onCheckpoint, referenced} {
		if !slices.Contains(left, l.ID) {
			t.Errorf("layer %s was removed", l.ID)
		}
	}
	if slices.Contains(left, garbage.ID) {
		t.Errorf("unused layer %s was kept", garbage.ID)
	}
}

func TestCollectGarbageNeedsLayerStore(t *testing.T) {
	c := New(nil, fakeSandboxes{}, nil)
	if _, err := c.CollectGarbage(context.Background(), 0); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("without a layer store: %v, want ErrFailedPrecondition", err)
	}
	if d := c.StorageDriver(); d != "" {
		t.Errorf("storage driver %q without a layer store", d)
	}
}

// LayerBytes charges a tenant the layers of its checkpoints, of its
// templates' references and of extra, each once, and neither another
// tenant's layers nor the admin's shared catalogue.
func TestLayerBytes(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	ls, err := layers.New(filepath.Join(t.TempDir(), "layers"), ids)
	if err != nil {
		t.Fatal(err)
	}
	shared, mine, theirs, ck, extra := layer(t, ls, "shared"), layer(t, ls, "mine"), layer(t, ls, "theirs"), layer(t, ls, "ck"), layer(t, ls, "extra")
	for ref, l := range map[string]layers.Layer{
		"template/busybox":                               shared,
		"template/" + tenant.Qualify("acme", "t"):        mine,
		"template/" + tenant.Qualify("acme", "t") + "@2": mine,
		"template/" + tenant.Qualify("other", "t"):       theirs,
	} {
		if err := ls.Ref(ctx, l.ID, ref); err != nil {
			t.Fatal(err)
		}
	}
	cks := fakeCheckpoints{recs: []store.CheckpointRecord{
		{Checkpoint: api.Checkpoint{Tenant: "acme"}, Layer: ck.ID},
		{Checkpoint: api.Checkpoint{Tenant: "other"}, Layer: theirs.ID},
	}}
	c := New(ls, fakeSandboxes{}, cks)
	got, err := c.LayerBytes(ctx, "acme", []string{extra.ID, mine.ID})
	if err != nil {
		t.Fatal(err)
	}
	if want := mine.Size + ck.Size + extra.Size; got != want || want == 0 {
		t.Errorf("LayerBytes(acme) = %d, want %d", got, want)
	}
	if got, _ := LayerBytes(ctx, nil, cks, "acme", nil); got != 0 {
		t.Errorf("LayerBytes without a layer store = %d, want 0", got)
	}
}
