package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

// recExt records the hooks called on it, in order, into a shared log.
type recExt struct {
	name string
	log  *[]string
	fail bool // WrapExec fails
}

func (e *recExt) Name() string { return e.name }

func (e *recExt) WrapExec(ctx context.Context, h *Handle, req *api.ExecRequest) (ExecRun, error) {
	*e.log = append(*e.log, e.name+".wrap")
	if e.fail {
		return nil, errors.New(e.name + " refuses")
	}
	if req.Env == nil {
		req.Env = map[string]string{}
	}
	req.Env[e.name] = "1"
	return &recRun{e}, nil
}

func (e *recExt) Observe(ctx context.Context, op Op) {
	*e.log = append(*e.log, e.name+".observe:"+op.Kind)
}

type recRun struct{ e *recExt }

func (r *recRun) Started(pid int, s execstream.Stream) execstream.Stream {
	*r.e.log = append(*r.e.log, r.e.name+".started")
	if s == nil {
		return nil
	}
	return tagStream{s, r.e.name}
}

func (r *recRun) Abort() { *r.e.log = append(*r.e.log, r.e.name+".abort") }

// tagStream names the wrapper that made it.
type tagStream struct {
	execstream.Stream
	tag string
}

func TestCollectHooksRefusesDuplicatesAndNil(t *testing.T) {
	var log []string
	if _, err := collectHooks([]Extension{&recExt{name: "a", log: &log}, &recExt{name: "a", log: &log}}); err == nil {
		t.Error("two extensions named a: no error")
	}
	if _, err := collectHooks([]Extension{nil}); err == nil {
		t.Error("nil extension: no error")
	}
	hs, err := collectHooks([]Extension{&recExt{name: "a", log: &log}, &recExt{name: "b", log: &log}})
	if err != nil {
		t.Fatal(err)
	}
	if len(hs.exec) != 2 || len(hs.observers) != 2 || len(hs.create) != 0 || len(hs.stream) != 0 {
		t.Errorf("hooks sorted wrong: %d exec, %d observers, %d create, %d stream", len(hs.exec), len(hs.observers), len(hs.create), len(hs.stream))
	}
}

func TestExecChainOrder(t *testing.T) {
	var log []string
	exts := []Extension{&recExt{name: "a", log: &log}, &recExt{name: "b", log: &log}}
	hs, err := collectHooks(exts)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{hooks: hs, cfg: Config{Clock: clock.Real{}}}
	b := &box{}
	var req api.ExecRequest
	chain, err := m.wrapExec(context.Background(), b, &req)
	if err != nil {
		t.Fatal(err)
	}
	if req.Env["a"] != "1" || req.Env["b"] != "1" {
		t.Errorf("wrappers did not change the request: %v", req.Env)
	}
	s := chain.started(7, tagStream{tag: "guest"})
	// The first-registered wrapper's stream is the outermost.
	if ts, ok := s.(tagStream); !ok || ts.tag != "a" {
		t.Errorf("outermost stream = %#v, want a's", s)
	}
	if got, want := strings.Join(log, " "), "a.wrap b.wrap b.started a.started"; got != want {
		t.Errorf("hook order = %q, want %q", got, want)
	}
}

func TestExecChainAbortsOnError(t *testing.T) {
	var log []string
	exts := []Extension{&recExt{name: "a", log: &log}, &recExt{name: "b", log: &log}, &recExt{name: "c", log: &log, fail: true}}
	hs, err := collectHooks(exts)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{hooks: hs, cfg: Config{Clock: clock.Real{}}}
	var req api.ExecRequest
	if _, err := m.wrapExec(context.Background(), &box{}, &req); err == nil || !strings.Contains(err.Error(), "c refuses") {
		t.Fatalf("wrapExec error = %v, want c's", err)
	}
	if got, want := strings.Join(log, " "), "a.wrap b.wrap c.wrap b.abort a.abort"; got != want {
		t.Errorf("hook order = %q, want %q", got, want)
	}
}

func TestObserversSeeOpsInOrder(t *testing.T) {
	var log []string
	hs, err := collectHooks([]Extension{&recExt{name: "a", log: &log}, &recExt{name: "b", log: &log}})
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{hooks: hs, cfg: Config{Clock: clock.Real{}}}
	m.observe(context.Background(), Op{Kind: OpExec})
	m.observe(context.Background(), Op{Kind: OpDelete})
	if got, want := strings.Join(log, " "), "a.observe:exec b.observe:exec a.observe:delete b.observe:delete"; got != want {
		t.Errorf("observed %q, want %q", got, want)
	}
}

func TestUnhandledSecretsRefused(t *testing.T) {
	m := &Manager{cfg: Config{Clock: clock.Real{}}}
	for _, req := range []api.ExecRequest{{Secrets: []api.ExecSecret{{Name: "a"}}}, {Token: true}} {
		if _, err := m.wrapExecChecked(context.Background(), &box{}, &req); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%+v without a secrets extension: %v, want failed precondition", req, err)
		}
	}
	req := api.ExecRequest{Cmd: []string{"true"}}
	if _, err := m.wrapExecChecked(context.Background(), &box{}, &req); err != nil {
		t.Errorf("plain exec without extensions: %v", err)
	}
}

func TestNetworkRefusedWithoutPrepareHook(t *testing.T) {
	m := &Manager{cfg: Config{Clock: clock.Real{}}}
	req := api.CreateSandboxRequest{Network: &api.NetworkSpec{Mode: api.NetworkEgress}}
	if err := m.prepare(context.Background(), &req); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("egress without a network extension: %v, want failed precondition", err)
	}
	req = api.CreateSandboxRequest{Network: &api.NetworkSpec{Mode: api.NetworkNone}}
	if err := m.prepare(context.Background(), &req); err != nil || req.Network != nil {
		t.Errorf("mode none without a network extension: %v, spec %v; want accepted as no spec", err, req.Network)
	}
}
