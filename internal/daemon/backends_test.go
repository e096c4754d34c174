package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// stubBackend has a name and records whether it was closed.
type stubBackend struct {
	name   string
	closed bool
}

func (s *stubBackend) Capabilities() runtime.Capabilities { return runtime.Capabilities{Name: s.name} }
func (s *stubBackend) Create(context.Context, runtime.Spec) (runtime.Sandbox, error) {
	return nil, errdefs.ErrUnavailable
}
func (s *stubBackend) Recover(context.Context, runtime.Spec, []byte) (runtime.Sandbox, error) {
	return nil, errdefs.ErrNotFound
}
func (s *stubBackend) Cleanup(context.Context, runtime.Spec) error { return nil }
func (s *stubBackend) Close() error                                { s.closed = true; return nil }

// factories returns factories of stub backends by name, those in failing
// failing to start; made collects what they built.
func factories(made *[]*stubBackend, failing string, names ...string) []backendFactory {
	var out []backendFactory
	for _, n := range names {
		out = append(out, backendFactory{n, func(backendEnv) (runtime.Backend, error) {
			if n == failing {
				return nil, errors.New("not on this host")
			}
			b := &stubBackend{name: n}
			*made = append(*made, b)
			return b, nil
		}})
	}
	return out
}

func envWith(runtimeName string) backendEnv {
	cfg := config.Default()
	cfg.Runtime = runtimeName
	return backendEnv{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func TestNewBackendsDefault(t *testing.T) {
	var made []*stubBackend
	reg, err := newBackends(envWith(""), factories(&made, "", "other", "native"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if reg.DefaultName() != config.DefaultRuntime || !slices.Equal(reg.Names(), []string{"native", "other"}) {
		t.Fatalf("default %q, names %v; want native first", reg.DefaultName(), reg.Names())
	}
	reg, err = newBackends(envWith("other"), factories(&made, "", "native", "other"), nil)
	if err != nil || reg.DefaultName() != "other" {
		t.Fatalf("--runtime other: %v, default %q", err, reg.DefaultName())
	}
}

// TestNewBackendsUnknownRuntime: a daemon configured with a runtime it
// does not run refuses to start, saying which it runs, and closes what it
// built.
func TestNewBackendsUnknownRuntime(t *testing.T) {
	var made []*stubBackend
	_, err := newBackends(envWith("nosuch"), factories(&made, "", "native"), nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `runtime "nosuch": no such backend (this daemon runs native)`) {
		t.Fatalf("newBackends: %v", err)
	}
	if len(made) != 1 || !made[0].closed {
		t.Errorf("backends built are not closed: %+v", made)
	}
}

// TestCheckRuntime: the configured runtime must be a backend the daemon
// can build, built-in or given.
func TestCheckRuntime(t *testing.T) {
	var made []*stubBackend
	f := factories(&made, "", "native")
	if err := checkRuntime(envWith("").cfg, f, nil); err != nil {
		t.Errorf("default runtime: %v", err)
	}
	if err := checkRuntime(envWith("inproc").cfg, f, []runtime.Backend{&stubBackend{name: "inproc"}}); err != nil {
		t.Errorf("a given backend: %v", err)
	}
	err := checkRuntime(envWith("nosuch").cfg, f, nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `runtime "nosuch": no such backend (this daemon has native)`) {
		t.Errorf("unknown runtime: %v", err)
	}
	if len(made) != 0 {
		t.Errorf("checkRuntime built backends")
	}
}

// TestNewBackendsUnavailable: a backend other than the default that cannot
// start is left out; the default that cannot start stops the daemon.
func TestNewBackendsUnavailable(t *testing.T) {
	var made []*stubBackend
	reg, err := newBackends(envWith("native"), factories(&made, "gvisor", "native", "gvisor"), nil)
	if err != nil || !slices.Equal(reg.Names(), []string{"native"}) {
		t.Fatalf("names %v, %v; want native only", reg.Names(), err)
	}
	// Asking for it says why it is not there, not that there is no such
	// backend.
	if _, err := reg.Lookup("gvisor"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "not on this host") {
		t.Errorf("Lookup(gvisor) = %v; want failed precondition with the reason", err)
	}
	if u := reg.Unavailable(); len(u) != 1 || u["gvisor"] == nil {
		t.Errorf("Unavailable() = %v", u)
	}
	made = nil
	_, err = newBackends(envWith("gvisor"), factories(&made, "gvisor", "native", "gvisor"), nil)
	if err == nil || !strings.Contains(err.Error(), "starting the gvisor backend: not on this host") {
		t.Fatalf("default unavailable: %v", err)
	}
	if len(made) != 1 || !made[0].closed {
		t.Errorf("backends built are not closed: %+v", made)
	}
}

// TestNewBackendsExtra: a backend the caller built runs beside the
// built-in ones, and replaces the built-in one of its name, which is then
// not built at all.
func TestNewBackendsExtra(t *testing.T) {
	var made []*stubBackend
	mine := &stubBackend{name: "native"}
	test := &stubBackend{name: "inproc"}
	reg, err := newBackends(envWith("inproc"), factories(&made, "", "native"), []runtime.Backend{mine, test})
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 0 {
		t.Errorf("the replaced built-in backend was built")
	}
	if b, _ := reg.Lookup("native"); b != runtime.Backend(mine) || reg.Default() != runtime.Backend(test) {
		t.Errorf("native %v, default %v", b, reg.Default())
	}
}
