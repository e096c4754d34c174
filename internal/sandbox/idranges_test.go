package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/idrange"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
)

// TestIDRangesPerSandbox: every sandbox gets a range of its own, recorded
// in its api.Sandbox and passed to the backend with the canonical range as
// LayerIDs; a full allocator refuses a create with resource exhausted; a
// delete frees the range; a recovered record's range is taken again.
func TestIDRangesPerSandbox(t *testing.T) {
	m, _, be := newTestManager(t)
	alloc, err := idrange.New(200000, 4*idrange.SlotSize) // canonical + 3
	if err != nil {
		t.Fatal(err)
	}
	m.cfg.IDs, m.cfg.IDRanges = alloc.Canonical(), alloc

	seen := map[uint32]string{}
	var ids []string
	for range 3 {
		id := createTest(t, m, api.CreateSandboxRequest{})
		ids = append(ids, id)
		sb, err := m.GetSandbox(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		r := sb.IDRange
		if r == nil || r.Size != idrange.SlotSize || r.HostID == alloc.Canonical().HostID {
			t.Fatalf("sandbox %s: id range %+v", id, r)
		}
		if other, dup := seen[r.HostID]; dup {
			t.Fatalf("sandboxes %s and %s share range %d", id, other, r.HostID)
		}
		seen[r.HostID] = id
		spec := be.get(id).spec
		if want := (runtime.IDMap{HostID: r.HostID, Size: r.Size}); spec.UIDMap != want || spec.GIDMap != want || spec.LayerIDs != alloc.Canonical() {
			t.Fatalf("backend spec maps %+v/%+v layers %+v, want %+v over %+v", spec.UIDMap, spec.GIDMap, spec.LayerIDs, want, alloc.Canonical())
		}
	}
	// Full: the fourth is refused before anything is started.
	p := m.paths("full")
	rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: "full", State: api.StateCreating}, Layers: []string{t.TempDir()}, UpperDir: p.upper, WorkDir: p.work, SocketPath: p.socket, StateDir: p.state}
	if _, err := m.start(context.Background(), rec, true); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("fourth create: %v, want resource exhausted", err)
	}
	if be.get("full") != nil {
		t.Fatal("a sandbox was started without a range")
	}
	// A delete frees its range for the next create.
	first, _ := m.GetSandbox(context.Background(), ids[0])
	if err := m.DeleteSandbox(context.Background(), ids[0]); err != nil {
		t.Fatal(err)
	}
	next := createTest(t, m, api.CreateSandboxRequest{})
	sb, _ := m.GetSandbox(context.Background(), next)
	if sb.IDRange == nil || sb.IDRange.HostID != first.IDRange.HostID {
		t.Fatalf("after a delete the next create got %+v, want the freed %+v", sb.IDRange, first.IDRange)
	}
	// Recovery takes a recorded range again.
	alloc2, _ := idrange.New(200000, 4*idrange.SlotSize)
	m.cfg.IDRanges = alloc2
	m.adoptIDs(context.Background(), store.SandboxRecord{Sandbox: sb})
	if err := alloc2.Adopt(runtime.IDMap{HostID: sb.IDRange.HostID, Size: sb.IDRange.Size}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("a recovered sandbox's range is not taken: %v", err)
	}
}
