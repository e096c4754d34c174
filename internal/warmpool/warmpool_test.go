package warmpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
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

// ResolveRuntime knows backends native (the default) and gvisor, and a
// backend "absent" that cannot run here; template "sentried" names gvisor.
func (fakeCore) ResolveRuntime(ctx context.Context, template, asked string) (string, error) {
	if asked == "" && template == "sentried" {
		asked = "gvisor"
	}
	switch asked {
	case "":
		return "native", nil
	case "native", "gvisor":
		return asked, nil
	case "absent":
		return "", fmt.Errorf("runtime absent is not available on this host: %w", errdefs.ErrFailedPrecondition)
	}
	return "", fmt.Errorf("no such backend: %w", errdefs.ErrInvalidArgument)
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

// sizes is k's pools' sizes by TEMPLATE:RUNTIME.
func sizes(t *testing.T, k *Keeper) map[string]int {
	t.Helper()
	ps, err := k.Pools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, p := range ps {
		out[p.Template+":"+p.Runtime] = p.Size
	}
	return out
}

// saved is the pools.json in dir.
func saved(t *testing.T, dir string) map[string]int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "pools.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]int
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("pools.json %s: %v", data, err)
	}
	return out
}

func TestProvisionNeedsHiddenCore(t *testing.T) {
	k := New(Config{DataDir: t.TempDir()})
	if err := k.Provision(struct{ sandbox.Core }{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("provision with a plain core: %v", err)
	}
	if _, err := k.SetPool(context.Background(), "busybox", "", 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("set pool unattached: %v", err)
	}
}

func TestSetPoolValidates(t *testing.T) {
	k := newKeeper(t, t.TempDir())
	ctx := context.Background()
	for _, c := range []struct {
		name, rt string
		size     int
	}{{"Bad Name", "", 1}, {"busybox", "", -1}, {"busybox", "", maxPoolSize + 1}, {"busybox", "nope", 1}} {
		if _, err := k.SetPool(ctx, c.name, c.rt, c.size); !errdefs.IsInvalidArgument(err) {
			t.Errorf("set pool %q on %q %d: %v, want invalid argument", c.name, c.rt, c.size, err)
		}
	}
	if _, err := k.SetPool(ctx, "missing", "", 1); !errdefs.IsNotFound(err) {
		t.Errorf("set pool of a missing template: %v, want not found", err)
	}
	if _, err := k.SetPool(ctx, "busybox", "absent", 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("set pool on a backend this host cannot run: %v, want failed precondition", err)
	}
	for _, bad := range []string{"Bad Name", "busybox:nope", "busybox:absent"} {
		if err := k.SetPools(ctx, map[string]int{bad: 1}); err == nil {
			t.Errorf("configured pool %q accepted", bad)
		}
	}
	if err := k.SetPools(ctx, map[string]int{"busybox": 1, "busybox:native": 2}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("one pool configured twice (busybox, busybox:native): %v", err)
	}
	if got := sizes(t, k); len(got) != 0 {
		t.Errorf("pools after refused sizes: %v", got)
	}
}

// TestAPISizesWin: sizes set through the API outlive the daemon and win
// over its configuration, per template and backend.
func TestAPISizesWin(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	k := newKeeper(t, dir)
	p, err := k.SetPool(ctx, "busybox", "", 3)
	if err != nil {
		t.Fatal(err)
	}
	if p.Template != "busybox" || p.Runtime != "native" || p.Size != 3 {
		t.Fatalf("set pool: %+v", p)
	}
	if p, err = k.SetPool(ctx, "busybox", "gvisor", 1); err != nil || p.Runtime != "gvisor" || p.Size != 1 {
		t.Fatalf("set pool on gvisor: %+v, %v", p, err)
	}
	if got := saved(t, dir); got["busybox:native"] != 3 || got["busybox:gvisor"] != 1 || len(got) != 2 {
		t.Fatalf("pools.json %v", got)
	}

	next := newKeeper(t, dir)
	if err := next.SetPools(ctx, map[string]int{"busybox": 1, "busybox:gvisor": 5, "alpine": 2, "alpine:gvisor": 4}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"busybox:native": 3, "busybox:gvisor": 1, "alpine:native": 2, "alpine:gvisor": 4}
	if got := sizes(t, next); !maps.Equal(got, want) {
		t.Fatalf("pools after a restart: %v, want %v", got, want)
	}
	// The configuration set none of them through the API.
	if got := saved(t, dir); len(got) != 2 {
		t.Fatalf("pools.json after a restart %v", got)
	}
}

// TestPoolRuntimeDefault: a pool set without a backend is the pool of the
// backend a create of its template naming none runs on: the template's
// runtime, else the default.
func TestPoolRuntimeDefault(t *testing.T) {
	k := newKeeper(t, t.TempDir())
	ctx := context.Background()
	if p, err := k.SetPool(ctx, "sentried", "", 1); err != nil || p.Runtime != "gvisor" {
		t.Fatalf("pool of a gvisor template: %+v, %v", p, err)
	}
	if p, err := k.SetPool(ctx, "sentried", "native", 2); err != nil || p.Runtime != "native" {
		t.Fatalf("native pool of a gvisor template: %+v, %v", p, err)
	}
	if err := k.SetPools(ctx, map[string]int{"busybox": 1}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"sentried:gvisor": 1, "sentried:native": 2, "busybox:native": 1}
	if got := sizes(t, k); !maps.Equal(got, want) {
		t.Fatalf("pools %v, want %v", got, want)
	}
}

// TestPoolsFileBeforeRuntimes: a pools.json written before pools had a
// backend is read as the pools of each template's default backend; a
// saved pool of a backend this host cannot run is not filled but stays in
// the file; a removal set through the API stays over the configuration.
func TestPoolsFileBeforeRuntimes(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(dir, "pools.json"), []byte(`{"busybox":3,"sentried":2,"alpine:absent":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	k := newKeeper(t, dir)
	if err := k.SetPools(ctx, map[string]int{"busybox": 1, "debian": 1}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"busybox:native": 3, "sentried:gvisor": 2, "debian:native": 1}
	if got := sizes(t, k); !maps.Equal(got, want) {
		t.Fatalf("pools from an old file: %v, want %v", got, want)
	}
	if _, err := k.SetPool(ctx, "debian", "", 0); err != nil {
		t.Fatal(err)
	}
	// Removing a pool of a backend gone from this host works too.
	if _, err := k.SetPool(ctx, "alpine", "absent", 0); err != nil {
		t.Fatalf("removing the pool of an absent backend: %v", err)
	}
	wantSaved := map[string]int{"busybox:native": 3, "sentried:gvisor": 2, "alpine:absent": 0, "debian:native": 0}
	if got := saved(t, dir); !maps.Equal(got, wantSaved) {
		t.Fatalf("pools.json %v, want %v", got, wantSaved)
	}
	next := newKeeper(t, dir)
	if err := next.SetPools(ctx, map[string]int{"debian": 1}); err != nil {
		t.Fatal(err)
	}
	if got := sizes(t, next)["debian:native"]; got != 0 {
		t.Fatalf("a pool removed through the API came back from the configuration: size %d", got)
	}
}

func TestInterceptCreateDeclines(t *testing.T) {
	k := newKeeper(t, t.TempDir())
	ctx := context.Background()
	if _, err := k.SetPool(ctx, "busybox", "", 1); err != nil {
		t.Fatal(err)
	}
	tmpl := templates.Template{Name: "busybox", ID: "busybox-1"}
	for _, req := range []api.CreateSandboxRequest{
		{Template: "busybox", Runtime: "native"}, // the pool has nothing ready: its creates fail
		{Template: "busybox", Runtime: "native", Resources: api.Resources{PidsMax: 77}},
		{Template: "busybox", Runtime: "native", Hostname: "h"},
		{Template: "busybox", Runtime: "native", Network: &api.NetworkSpec{Mode: api.NetworkNone}},
	} {
		if sb, ok := k.InterceptCreate(ctx, req, tmpl); ok {
			t.Errorf("create %+v served from the pool: %+v", req, sb)
		}
	}
	if _, ok := k.InterceptCreate(ctx, api.CreateSandboxRequest{Template: "alpine"}, templates.Template{Name: "alpine"}); ok {
		t.Error("create of a template without a pool served")
	}
	k.DrainPools(ctx)
	if _, err := k.SetPool(ctx, "busybox", "", 2); !errdefs.IsUnavailable(err) {
		t.Errorf("set pool after drain: %v, want unavailable", err)
	}
}

// FuzzPoolsFile: whatever pools.json holds, load neither panics nor
// invents a pool without a backend, and every key it returns is written
// back as the same key (TEMPLATE:RUNTIME splits into it again).
func FuzzPoolsFile(f *testing.F) {
	for _, s := range []string{`{"busybox":3}`, `{"busybox:gvisor":1,"sentried":2}`, `{"a:b:c":1}`, `{":":1}`, `{"x:absent":1}`, `[]`, `{"busybox":"x"}`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "pools.json"), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		k := New(Config{DataDir: dir})
		if err := k.Provision(fakeCore{}); err != nil {
			t.Fatal(err)
		}
		for key := range k.load(context.Background()) {
			if key.runtime == "" {
				t.Fatalf("%q: pool %+v without a backend", data, key)
			}
			if name, rt := splitKey(key.String()); name != key.template || rt != key.runtime {
				t.Fatalf("%q: key %+v is written as %q, read back as %q %q", data, key, key.String(), name, rt)
			}
		}
	})
}
