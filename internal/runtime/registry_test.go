package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// stub is a backend that only has a name; the optional interfaces are
// added by the types below.
type stub struct{ name string }

func (s *stub) Capabilities() runtime.Capabilities { return runtime.Capabilities{Name: s.name} }
func (s *stub) Create(context.Context, runtime.Spec) (runtime.Sandbox, error) {
	return nil, errdefs.ErrUnavailable
}
func (s *stub) Recover(context.Context, runtime.Spec, []byte) (runtime.Sandbox, error) {
	return nil, errdefs.ErrNotFound
}
func (s *stub) Cleanup(context.Context, runtime.Spec) error { return nil }

// full implements every optional daemon-wide interface, recording calls
// in log.
type full struct {
	stub
	log      *[]string
	closeErr error
	sweep    []string
}

func (f *full) Close() error { *f.log = append(*f.log, "close "+f.name); return f.closeErr }
func (f *full) FillPool()    { *f.log = append(*f.log, "fill "+f.name) }
func (f *full) SweepOrphans(_ context.Context, keep func(string) bool) ([]string, error) {
	var out []string
	for _, id := range f.sweep {
		if !keep(id) {
			out = append(out, id)
		}
	}
	return out, nil
}

var (
	_ runtime.Closer     = (*full)(nil)
	_ runtime.Sweeper    = (*full)(nil)
	_ runtime.Prespawner = (*full)(nil)
)

func TestRegistryLookup(t *testing.T) {
	a, b := &stub{"alpha"}, &stub{"beta"}
	r, err := runtime.NewRegistry("beta", a, b)
	if err != nil {
		t.Fatal(err)
	}
	if r.DefaultName() != "beta" || r.Default() != runtime.Backend(b) {
		t.Fatalf("default %q %v, want beta", r.DefaultName(), r.Default())
	}
	for name, want := range map[string]runtime.Backend{"": b, "beta": b, "alpha": a} {
		got, err := r.Lookup(name)
		if err != nil || got != want {
			t.Errorf("Lookup(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	if got := r.Names(); !slices.Equal(got, []string{"beta", "alpha"}) {
		t.Errorf("Names() = %v, want the default first", got)
	}
	if got := r.All(); len(got) != 2 || got[0] != runtime.Backend(b) || got[1] != runtime.Backend(a) {
		t.Errorf("All() = %v", got)
	}
}

func TestRegistryUnknownName(t *testing.T) {
	r, err := runtime.NewRegistry("", &stub{"native"}, &stub{"gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Lookup("nosuch")
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Lookup(nosuch): %v, want invalid argument", err)
	}
	if want := `runtime "nosuch": no such backend (this daemon runs native, gvisor)`; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

func TestRegistryDefault(t *testing.T) {
	r, err := runtime.NewRegistry("", &stub{"first"}, &stub{"second"})
	if err != nil {
		t.Fatal(err)
	}
	if r.DefaultName() != "first" {
		t.Errorf("default %q, want the first registered", r.DefaultName())
	}
	if _, err := runtime.NewRegistry("nosuch", &stub{"first"}); !errdefs.IsInvalidArgument(err) ||
		!strings.Contains(err.Error(), `runtime "nosuch": no such backend (this daemon runs first)`) {
		t.Errorf("default naming no backend: %v", err)
	}
}

func TestRegistryRefuses(t *testing.T) {
	for _, c := range []struct {
		name     string
		backends []runtime.Backend
		want     string
	}{
		{"none", nil, "no backend"},
		{"duplicate", []runtime.Backend{&stub{"native"}, &stub{"native"}}, `backend "native" registered twice`},
		{"empty name", []runtime.Backend{&stub{""}}, `backend name "" is not valid`},
		{"bad name", []runtime.Backend{&stub{"Native!"}}, `backend name "Native!" is not valid`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := runtime.NewRegistry("", c.backends...)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("NewRegistry: %v, want invalid argument saying %q", err, c.want)
			}
		})
	}
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"native": true, "gvisor": true, "in-proc2": true, "": false, "-x": false,
		"Native": false, "a b": false, "a/b": false, strings.Repeat("a", 32): true, strings.Repeat("a", 33): false,
	} {
		if got := runtime.ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestRegistryOptionalInterfaces: FillPools, SweepOrphans and Close reach
// the backends that implement Prespawner, Sweeper and Closer, and only
// those; Close goes last registered first and joins errors.
func TestRegistryOptionalInterfaces(t *testing.T) {
	var log []string
	boom := errors.New("boom")
	a := &full{stub: stub{"alpha"}, log: &log, sweep: []string{"x", "y"}}
	b := &full{stub: stub{"beta"}, log: &log, closeErr: boom, sweep: []string{"z"}}
	r, err := runtime.NewRegistry("", a, &stub{"plain"}, b)
	if err != nil {
		t.Fatal(err)
	}
	r.FillPools()
	swept, err := r.SweepOrphans(context.Background(), func(id string) bool { return id == "y" })
	if err != nil || !slices.Equal(swept, []string{"x", "z"}) {
		t.Errorf("SweepOrphans = %v, %v; want [x z]", swept, err)
	}
	err = r.Close()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "closing backend beta") {
		t.Errorf("Close: %v, want beta's error", err)
	}
	if want := []string{"fill alpha", "fill beta", "close beta", "close alpha"}; !slices.Equal(log, want) {
		t.Errorf("calls %v, want %v", log, want)
	}
}

// TestRegistryUnavailable: a backend marked unavailable is refused by
// Lookup with its reason, failed precondition unless the reason has a
// category of its own; a running backend is never marked; an unknown name
// is still invalid.
func TestRegistryUnavailable(t *testing.T) {
	r, err := runtime.NewRegistry("", &stub{name: "native"})
	if err != nil {
		t.Fatal(err)
	}
	r.MarkUnavailable("gvisor", errors.New("runsc is not installed"))
	r.MarkUnavailable("vm", fmt.Errorf("no kvm: %w", errdefs.ErrUnavailable))
	r.MarkUnavailable("native", errors.New("ignored: it runs"))
	if _, err := r.Lookup("gvisor"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), `runtime "gvisor" is not available on this host: runsc is not installed`) {
		t.Errorf("Lookup(gvisor) = %v", err)
	}
	if _, err := r.Lookup("vm"); !errdefs.IsUnavailable(err) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Lookup(vm) = %v; want its own category", err)
	}
	if b, err := r.Lookup("native"); err != nil || b.Capabilities().Name != "native" {
		t.Errorf("Lookup(native) = %v, %v", b, err)
	}
	if _, err := r.Lookup("nosuch"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Lookup(nosuch) = %v", err)
	}
	if u := r.Unavailable(); len(u) != 2 || u["gvisor"] == nil || u["vm"] == nil {
		t.Errorf("Unavailable() = %v", u)
	}
}
