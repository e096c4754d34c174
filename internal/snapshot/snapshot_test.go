package snapshot

import (
	"context"
	"errors"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// onlyCore is a sandbox.Core without the checkpoint API.
type onlyCore struct{ sandbox.Core }

func TestProvisionNeedsCheckpointAPI(t *testing.T) {
	if err := New(Config{}).Provision(onlyCore{}); err == nil {
		t.Fatal("provisioned by a core without LockRunning, CreateFork, ...")
	}
}

// fakeSandboxes records Exec and admits runs; everything else is nil.
type fakeSandboxes struct {
	Sandboxes
	admitErr error
	admitted []string
	execs    []api.ExecRequest
}

// Handle fails with admitErr: a transaction is refused before its
// admission can ask for the owner.
func (f *fakeSandboxes) Handle(ctx context.Context, id string) (*sandbox.Handle, error) {
	f.admitted = append(f.admitted, id)
	return nil, f.admitErr
}

func (f *fakeSandboxes) AdmitRun(ctx context.Context, tenant string) error { return nil }

func (f *fakeSandboxes) AdmitSandboxes(ctx context.Context, tenant string, n int, disk int64) (int64, func(), error) {
	return disk, func() {}, nil
}

func (f *fakeSandboxes) AdmitLayer(ctx context.Context, tenant, layer string) (func(), error) {
	return func() {}, nil
}

func (f *fakeSandboxes) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	f.execs = append(f.execs, req)
	return nil, nil
}

func (f *fakeSandboxes) Report(ctx context.Context, op sandbox.Op) {}

// A plain exec passes through untouched; a transaction is admitted first
// (its sandbox looked up), and nothing runs when that fails.
func TestExecTransactionsOnly(t *testing.T) {
	f := &fakeSandboxes{}
	s := New(Config{Quotas: f})
	if err := s.Provision(f); err != nil {
		t.Fatal(err)
	}
	plain := api.ExecRequest{Cmd: []string{"true"}, Env: map[string]string{"A": "1"}}
	if _, err := s.Exec(context.Background(), "sb", plain); err != nil {
		t.Fatal(err)
	}
	if len(f.execs) != 1 || len(f.admitted) != 0 || f.execs[0].Env["A"] != "1" {
		t.Fatalf("plain exec: execs %v, admitted %v", f.execs, f.admitted)
	}
	f.admitErr = errdefs.ErrNotFound
	_, err := s.Exec(context.Background(), "sb", api.ExecRequest{Cmd: []string{"true"}, RollbackOnFailure: true})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("refused transaction: %v", err)
	}
	if len(f.execs) != 1 || len(f.admitted) != 1 {
		t.Fatalf("refused transaction ran: execs %v, admitted %v", f.execs, f.admitted)
	}
}
