package runsecrets

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sort"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// memStore is a SecretStore in memory.
type memStore map[string][]byte

func (s memStore) Put(ctx context.Context, name string, value []byte) (api.SecretInfo, error) {
	s[name] = value
	return api.SecretInfo{Name: name}, nil
}

func (s memStore) Secret(ctx context.Context, name string) ([]byte, error) {
	v, ok := s[name]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return v, nil
}

func (s memStore) List(ctx context.Context) ([]api.SecretInfo, error) {
	var out []api.SecretInfo
	for n := range s {
		out = append(out, api.SecretInfo{Name: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s memStore) Delete(ctx context.Context, name string) error {
	if _, ok := s[name]; !ok {
		return errdefs.ErrNotFound
	}
	delete(s, name)
	return nil
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestWithoutStoreOrTokens(t *testing.T) {
	ctx := context.Background()
	s := New(Config{Logger: discard()})
	if _, err := s.PutSecret(ctx, "a", []byte("v")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("PutSecret without a store: %v", err)
	}
	if _, err := s.ListSecrets(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("ListSecrets without a store: %v", err)
	}
	req := api.ExecRequest{Secrets: []api.ExecSecret{{Name: "a"}}}
	if _, err := s.WrapExec(ctx, nil, &req); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("exec with a secret without a store: %v", err)
	}
	if req.Secrets != nil || !req.Private {
		t.Errorf("request after WrapExec: secrets %v, private %v; want cleared, private", req.Secrets, req.Private)
	}
	if _, err := s.AuthorizeRun(ctx, "sb", "token"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("AuthorizeRun without tokens: %v", err)
	}
	if err := s.OnPurgeTenant(ctx, "acme"); err != nil {
		t.Errorf("purge without a store: %v", err)
	}
}

func TestWrapExecRefusesBadRequests(t *testing.T) {
	ctx := context.Background()
	s := New(Config{Store: memStore{}, Logger: discard()})
	many := make([]api.ExecSecret, maxExecSecrets+1)
	for i := range many {
		many[i] = api.ExecSecret{Name: "s"}
	}
	for name, secs := range map[string][]api.ExecSecret{
		"too many":     many,
		"bad env name": {{Name: "a", Env: "1X"}},
	} {
		req := api.ExecRequest{Secrets: secs}
		if _, err := s.WrapExec(ctx, nil, &req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	// Nothing to do: no run, the request unchanged but for the fields the
	// guest never sees.
	req := api.ExecRequest{Cmd: []string{"true"}}
	r, err := s.WrapExec(ctx, nil, &req)
	if err != nil || r == nil || req.Private {
		t.Errorf("plain exec: run %v, err %v, private %v", r, err, req.Private)
	}
}

func TestPurgeDeletesTheTenantsSecrets(t *testing.T) {
	ctx := context.Background()
	st := memStore{"a": []byte("1"), "b": []byte("2")}
	s := New(Config{Store: st, Logger: discard()})
	if err := s.OnPurgeTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if len(st) != 0 {
		t.Errorf("secrets left after purge: %v", st)
	}
}

func TestRedactorForgottenOnDelete(t *testing.T) {
	s := New(Config{Logger: discard()})
	if s.Redactor("sb") != nil {
		t.Fatal("a redactor before any secret was given")
	}
	s.rememberSecrets("sb", map[string][]byte{"a": []byte("value-one")})
	s.rememberSecrets("sb", map[string][]byte{"a": []byte("value-two")}) // updated between runs
	red := s.Redactor("sb")
	if red == nil {
		t.Fatal("no redactor after a secret was given")
	}
	if got := red.RedactString("value-one value-two"); got == "value-one value-two" {
		t.Errorf("not redacted: %q", got)
	}
	s.OnDelete(context.Background(), "sb")
	if s.Redactor("sb") != nil {
		t.Error("redactor kept after the sandbox was deleted")
	}
}
