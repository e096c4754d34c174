package runsecrets_test

// The feature on a real Manager and real guests (sandboxtest, the
// in-process backend): secrets reach only their process and never the
// output, and a run token is good exactly while its run lives.

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runsecrets"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
	"github.com/agentbox/agentbox/internal/secrets"
)

// mapStore is a SecretStore in memory.
type mapStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *mapStore) Put(ctx context.Context, name string, value []byte) (api.SecretInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[name] = value
	return api.SecretInfo{Name: name}, nil
}

func (s *mapStore) Secret(ctx context.Context, name string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[name]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return v, nil
}

func (s *mapStore) List(ctx context.Context) ([]api.SecretInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []api.SecretInfo
	for n := range s.m {
		out = append(out, api.SecretInfo{Name: n})
	}
	return out, nil
}

func (s *mapStore) Delete(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, name)
	return nil
}

func newEnv(t *testing.T) (*sandboxtest.Env, *runsecrets.Secrets) {
	key, err := secrets.LoadOrCreateKey(filepath.Join(t.TempDir(), "key"))
	if err != nil {
		t.Fatal(err)
	}
	sec := runsecrets.New(runsecrets.Config{Store: &mapStore{m: map[string][]byte{}}, Tokens: secrets.NewTokens(key), Logger: slog.New(slog.DiscardHandler)})
	env := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) { c.Extensions = []sandbox.Extension{sec} })
	return env, sec
}

func TestInprocSecretsRedacted(t *testing.T) {
	env, sec := newEnv(t)
	ctx := sandboxtest.Context(t)
	const value = "s3cr3t-v4lue-0123456789"
	if _, err := sec.PutSecret(ctx, "api", []byte(value)); err != nil {
		t.Fatal(err)
	}
	if l, err := sec.ListSecrets(ctx); err != nil || len(l) != 1 {
		t.Fatalf("ListSecrets = %+v, %v", l, err)
	}
	sb := env.Create(api.CreateSandboxRequest{})
	r := env.Exec(sb.ID, api.ExecRequest{
		Command: `echo "$K"; printf %s "$K" | base64; test "$K" = "` + value + `"`,
		Secrets: []api.ExecSecret{{Name: "api", Env: "K"}},
	})
	if r.Code != 0 {
		t.Fatalf("the process did not get the secret: %+v", r)
	}
	if strings.Contains(r.Stdout, value) || strings.Contains(r.Stdout, base64.StdEncoding.EncodeToString([]byte(value))) {
		t.Fatalf("the secret reached the output: %q", r.Stdout)
	}
	// Another exec without it neither has it nor may print it.
	r = env.Exec(sb.ID, api.ExecRequest{Command: `echo "[$K]"; echo ` + value})
	if strings.Contains(r.Stdout, value) || !strings.Contains(r.Stdout, "[]") {
		t.Fatalf("exec without the secret: %q", r.Stdout)
	}
	if _, err := env.M.Exec(ctx, sb.ID, api.ExecRequest{Command: "true", Secrets: []api.ExecSecret{{Name: "missing", Env: "K"}}}); err == nil {
		t.Fatal("exec naming a missing secret started")
	}
	if err := sec.DeleteSecret(ctx, "api"); err != nil {
		t.Fatal(err)
	}
}

func TestInprocRunToken(t *testing.T) {
	env, sec := newEnv(t)
	ctx := sandboxtest.Context(t)
	sb := env.Create(api.CreateSandboxRequest{})
	p, err := env.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: `printf %s "$` + api.RunTokenEnv + `" > token; exec sleep 1000`, Token: true})
	if err != nil {
		t.Fatal(err)
	}
	var token string
	for deadline := time.Now().Add(30 * time.Second); token == ""; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(env.Upper(sb.ID), "token"))
		token = string(b)
		if time.Now().After(deadline) {
			t.Fatal("no token written")
		}
	}
	if _, err := sec.AuthorizeRun(ctx, sb.ID, token); err != nil {
		t.Fatalf("AuthorizeRun of a live run: %v", err)
	}
	if _, err := sec.AuthorizeRun(ctx, "another", token); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("AuthorizeRun for another sandbox: %v", err)
	}
	if run := sec.ActiveRun(ctx, sb.ID); run == "" {
		t.Fatal("no active run")
	}
	if err := sandboxfiles.New(env.M).Signal(ctx, sb.ID, p.Pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := sec.AuthorizeRun(ctx, sb.ID, token); errors.Is(err, errdefs.ErrUnauthenticated) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the token of an ended run is still good")
		}
	}
}
