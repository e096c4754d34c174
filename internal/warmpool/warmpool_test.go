package warmpool

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/templates"
)

// fakeCore resolves every template and fails every create: the pools'
// bookkeeping is tested without sandboxes (the core's side of hidden
// sandboxes is tested in internal/sandbox, the whole in test/pool_test.go).
type fakeCore struct {
	sandbox.Core // not used
}

func (fakeCore) ResolveTemplate(ctx context.Context, name string) (templates.Template, error) {
	if name == "missing" {
		return templates.Template{}, errdefs.ErrNotFound
	}
	return templates.Template{Name: name, ID: name + "-1"}, nil
}

func (fakeCore) CreateHidden(context.Context, api.CreateSandboxRequest, templates.Template, string, func(context.Context, *sandbox.Handle) error) (*sandbox.Handle, error) {
	return nil, errors.New("no sandboxes here")
}

func (fakeCore) DeleteHidden(context.Context, *sandbox.Handle) error { return nil }
func (fakeCore) HandOut(context.Context, *sandbox.Handle, api.CreateSandboxRequest, templates.Template) (api.Sandbox, error) {
	return api.Sandbox{}, errors.New("nothing to hand out")
}

func newKeeper(t *testing.T, dir string) *Keeper {
	t.Helper()
	k := New(Config{DataDir: dir})
	if err := k.Provision(fakeCore{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.DrainPools(context.Background()) })
	return k
}

func sizes(t *testing.T, k *Keeper) map[string]int {
	t.Helper()
	ps, err := k.Pools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, p := range ps {
		out[p.Template] = p.Size
	}
	return out
}

func TestProvisionNeedsHiddenCore(t *testing.T) {
	k := New(Config{DataDir: t.TempDir()})
	if err := k.Provision(struct{ sandbox.Core }{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("provision with a plain core: %v", err)
	}
	if _, err := k.SetPool(context.Background(), "busybox", 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("set pool unattached: %v", err)
	}
}

func TestSetPoolValidates(t *testing.T) {
	k := newKeeper(t, t.TempDir())
	ctx := context.Background()
	for _, c := range []struct {
		name string
		size int
	}{{"Bad Name", 1}, {"busybox", -1}, {"busybox", maxPoolSize + 1}} {
		if _, err := k.SetPool(ctx, c.name, c.size); !errdefs.IsInvalidArgument(err) {
			t.Errorf("set pool %q %d: %v, want invalid argument", c.name, c.size, err)
		}
	}
	if _, err := k.SetPool(ctx, "missing", 1); !errdefs.IsNotFound(err) {
		t.Errorf("set pool of a missing template: %v, want not found", err)
	}
	if err := k.SetPools(ctx, map[string]int{"Bad Name": 1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("configured pool with a bad name: %v", err)
	}
	if got := sizes(t, k); len(got) != 0 {
		t.Errorf("pools after refused sizes: %v", got)
	}
}

// TestAPISizesWin: sizes set through the API outlive the daemon and win
// over its configuration.
func TestAPISizesWin(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	k := newKeeper(t, dir)
	p, err := k.SetPool(ctx, "busybox", 3)
	if err != nil {
		t.Fatal(err)
	}
	if p.Template != "busybox" || p.Size != 3 {
		t.Fatalf("set pool: %+v", p)
	}
	data, err := os.ReadFile(filepath.Join(dir, "pools.json"))
	if err != nil {
		t.Fatal(err)
	}
	var saved map[string]int
	if err := json.Unmarshal(data, &saved); err != nil || saved["busybox"] != 3 {
		t.Fatalf("pools.json %s, %v", data, err)
	}

	next := newKeeper(t, dir)
	if err := next.SetPools(ctx, map[string]int{"busybox": 1, "alpine": 2}); err != nil {
		t.Fatal(err)
	}
	if got := sizes(t, next); got["busybox"] != 3 || got["alpine"] != 2 || len(got) != 2 {
		t.Fatalf("pools after a restart: %v", got)
	}
}

func TestInterceptCreateDeclines(t *testing.T) {
	k := newKeeper(t, t.TempDir())
	ctx := context.Background()
	if _, err := k.SetPool(ctx, "busybox", 1); err != nil {
		t.Fatal(err)
	}
	tmpl := templates.Template{Name: "busybox", ID: "busybox-1"}
	for _, req := range []api.CreateSandboxRequest{
		{Template: "busybox"}, // the pool has nothing ready: its creates fail
		{Template: "busybox", Resources: api.Resources{PidsMax: 77}},
		{Template: "busybox", Hostname: "h"},
		{Template: "busybox", Network: &api.NetworkSpec{Mode: api.NetworkNone}},
	} {
		if sb, ok := k.InterceptCreate(ctx, req, tmpl); ok {
			t.Errorf("create %+v served from the pool: %+v", req, sb)
		}
	}
	if _, ok := k.InterceptCreate(ctx, api.CreateSandboxRequest{Template: "alpine"}, templates.Template{Name: "alpine"}); ok {
		t.Error("create of a template without a pool served")
	}
	k.DrainPools(ctx)
	if _, err := k.SetPool(ctx, "busybox", 2); !errdefs.IsUnavailable(err) {
		t.Errorf("set pool after drain: %v, want unavailable", err)
	}
}
