// Package runsecrets gives sandbox runs their secrets and run tokens, and
// redacts every secret value a sandbox's runs were given from that
// sandbox's output. It is a feature attached to the sandbox core through
// its extension points (sandbox.ExecWrapper, sandbox.StreamWrapper,
// sandbox.DeleteHook): the core knows nothing of secrets.
package runsecrets

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/secrets"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/validate"
)

// Per-command secrets and per-run tokens.
//
// A secret named in an exec request is resolved here, host-side, and placed
// only in the environment of that one process (it travels to the guest in
// the exec request over the guest socket and from there into execve; the
// process runs private, so no other process of the sandbox can read that
// environment, see api.ExecRequest.Private): it is
// never written to the sandbox's filesystem, its record, a checkpoint or a
// log. Every value a sandbox's runs were given is remembered (in memory
// only) and redacted from all output of that sandbox's exec and attach
// streams before it leaves the daemon, including base64, URL-escaped and
// hex forms and values split across output chunks.
//
// A run asking for a token gets a JWT (secrets.Tokens) in AGENTBOX_RUN_TOKEN.
// The token is usable only while the run is live: Secrets keeps the set
// of live runs (in memory; a daemon restart ends them all) and drops a run
// when its process exits, its deadline passes, its sandbox is deleted or
// restarted (restore), so forks and restores never inherit a usable token.

const (
	maxExecSecrets     = 32
	defaultRunDeadline = time.Hour
	maxRunDeadline     = 24 * time.Hour
)

// SecretStore is the host-side secret store (internal/secrets.Store).
type SecretStore interface {
	Put(ctx context.Context, name string, value []byte) (api.SecretInfo, error)
	Secret(ctx context.Context, name string) ([]byte, error)
	List(ctx context.Context) ([]api.SecretInfo, error)
	Delete(ctx context.Context, name string) error
}

// Config configures Secrets.
type Config struct {
	// Store is the secret store; nil refuses exec requests naming
	// secrets or asking for a token (ErrFailedPrecondition).
	Store SecretStore
	// Tokens mints and verifies run tokens; nil refuses exec requests
	// asking for one.
	Tokens *secrets.Tokens
	Logger *slog.Logger
}

// Secrets is the extension: register it in sandbox.Config.Extensions.
// Its methods are safe for concurrent use.
type Secrets struct {
	store  SecretStore
	tokens *secrets.Tokens
	log    *slog.Logger
	core   sandbox.Core // set by Provision, before any hook runs

	// mu guards the fields below.
	mu sync.Mutex
	// used holds, per sandbox id, the secret values its runs were given.
	used map[string]map[string][]byte
	// runs are the live runs holding a token, by run id.
	runs map[string]*run
}

var (
	_ sandbox.Extension     = (*Secrets)(nil)
	_ sandbox.Provisioner   = (*Secrets)(nil)
	_ sandbox.ExecWrapper   = (*Secrets)(nil)
	_ sandbox.StreamWrapper = (*Secrets)(nil)
	_ sandbox.DeleteHook    = (*Secrets)(nil)
	_ sandbox.PurgeHook     = (*Secrets)(nil)
)

// New returns the extension. Logger is required.
func New(cfg Config) *Secrets {
	return &Secrets{store: cfg.Store, tokens: cfg.Tokens, log: cfg.Logger}
}

// Name implements sandbox.Extension.
func (m *Secrets) Name() string { return "runsecrets" }

// Provision implements sandbox.Provisioner.
func (m *Secrets) Provision(c sandbox.Core) error {
	m.core = c
	return nil
}

// OnDelete implements sandbox.DeleteHook: the sandbox's runs end and its
// values are forgotten.
func (m *Secrets) OnDelete(ctx context.Context, id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.used, id)
	for rid, r := range m.runs {
		if r.sandbox == id {
			delete(m.runs, rid)
		}
	}
}

// run is one live exec that holds a token.
type run struct {
	id, sandbox, boot string
	rt                runtime.Sandbox // the sandbox's runtime instance at mint time
	expires           time.Time
	pid               int           // the process, once started (guarded by Secrets.mu)
	started           chan struct{} // closed when pid is set
}

// Store returns the secret store (nil when none is configured).
func (m *Secrets) Store() SecretStore { return m.store }

func (m *Secrets) secretStore() (SecretStore, error) {
	if m.store == nil {
		return nil, fmt.Errorf("no secret store is configured: %w", errdefs.ErrFailedPrecondition)
	}
	return m.store, nil
}

// OnPurgeTenant implements sandbox.PurgeHook: it deletes the tenant's
// secrets (ctx acts as the tenant).
func (m *Secrets) OnPurgeTenant(ctx context.Context, _ string) error {
	if m.store == nil {
		return nil
	}
	secs, err := m.store.List(ctx)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, s := range secs {
		if err := m.store.Delete(ctx, s.Name); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PutSecret stores a secret value (write-only: no method returns it to a
// client).
func (m *Secrets) PutSecret(ctx context.Context, name string, value []byte) (api.SecretInfo, error) {
	st, err := m.secretStore()
	if err != nil {
		return api.SecretInfo{}, err
	}
	info, err := st.Put(ctx, name, value)
	if err != nil {
		return api.SecretInfo{}, err
	}
	m.log.InfoContext(ctx, "secret stored", "secret", name)
	return info, nil
}

// ListSecrets lists secret names and times.
func (m *Secrets) ListSecrets(ctx context.Context) ([]api.SecretInfo, error) {
	st, err := m.secretStore()
	if err != nil {
		return nil, err
	}
	return st.List(ctx)
}

// DeleteSecret removes a secret. Values already given to runs stay
// redacted from those sandboxes' output.
func (m *Secrets) DeleteSecret(ctx context.Context, name string) error {
	st, err := m.secretStore()
	if err != nil {
		return err
	}
	if err := st.Delete(ctx, name); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "secret deleted", "secret", name)
	return nil
}

// WrapExec implements sandbox.ExecWrapper: it resolves req's secrets into
// req.Env and, when req.Token is set, mints the run's token into it and
// registers the run as live. It clears req.Secrets and req.Token, which
// the guest never sees. On error nothing is registered. The returned run
// redacts the process's output and ends the run (revoking its token) when
// the process exits or does not start.
func (m *Secrets) WrapExec(ctx context.Context, h *sandbox.Handle, req *api.ExecRequest) (sandbox.ExecRun, error) {
	r, err := m.prepareRun(ctx, h, req)
	if err != nil {
		return nil, err
	}
	return &execRun{m: m, h: h, r: r}, nil
}

// execRun follows one exec for WrapExec.
type execRun struct {
	m *Secrets
	h *sandbox.Handle
	r *run // nil: no token
}

// Started implements sandbox.ExecRun.
func (e *execRun) Started(pid int, s execstream.Stream) execstream.Stream {
	if s == nil {
		e.m.followRun(e.h, e.r, pid)
		return nil
	}
	return e.m.wrapStream(e.h, s, e.r, pid)
}

// Abort implements sandbox.ExecRun.
func (e *execRun) Abort() { e.m.endRun(e.r) }

// WrapStream implements sandbox.StreamWrapper: the output of an attach or
// watch is redacted like the exec's.
func (m *Secrets) WrapStream(h *sandbox.Handle, pid int, s execstream.Stream) execstream.Stream {
	return m.wrapStream(h, s, nil, pid)
}

// prepareRun does WrapExec's work; it returns the run (nil when no token).
func (m *Secrets) prepareRun(ctx context.Context, h *sandbox.Handle, req *api.ExecRequest) (*run, error) {
	want, token := req.Secrets, req.Token
	req.Secrets, req.Token = nil, false
	if len(want) == 0 && !token {
		return nil, nil
	}
	if len(want) > maxExecSecrets {
		return nil, fmt.Errorf("at most %d secrets per exec: %w", maxExecSecrets, errdefs.ErrInvalidArgument)
	}
	// A process holding a secret or a token runs private: the sandbox's
	// other processes cannot read its environment (guest, domains.go).
	req.Private = true
	st, tokens := m.store, m.tokens
	if st == nil || (token && tokens == nil) {
		return nil, fmt.Errorf("secrets and run tokens are not configured: %w", errdefs.ErrFailedPrecondition)
	}
	if req.Env == nil {
		req.Env = map[string]string{}
	}
	values := make(map[string][]byte, len(want))
	seenEnv := map[string]bool{}
	for _, s := range want {
		if err := secrets.ValidName(s.Name); err != nil {
			return nil, err
		}
		env := s.Env
		if env == "" {
			env = s.Name
		}
		if validate.EnvName(env) != nil {
			return nil, fmt.Errorf("secret %s: environment variable name %q is not valid: %w", s.Name, env, errdefs.ErrInvalidArgument)
		}
		if seenEnv[env] || (token && env == api.RunTokenEnv) {
			return nil, fmt.Errorf("environment variable %s is set twice: %w", env, errdefs.ErrInvalidArgument)
		}
		seenEnv[env] = true
		// The sandbox's tenant's secret, whoever runs the command.
		v, err := st.Secret(tenant.WithPrincipal(ctx, tenant.Principal{Tenant: h.Owner(), Scope: api.ScopeFull}), s.Name)
		if err != nil {
			return nil, err
		}
		if len(v) > validate.MaxValueLen || containsNUL(v) {
			return nil, fmt.Errorf("secret %s cannot be placed in an environment variable (NUL byte or over %d bytes): %w", s.Name, validate.MaxValueLen, errdefs.ErrInvalidArgument)
		}
		req.Env[env] = string(v)
		values[s.Name] = v
	}
	id := h.ID()
	if len(values) > 0 {
		m.rememberSecrets(id, values)
	}
	if !token {
		return nil, nil
	}
	rt := h.Runtime()
	deadline := defaultRunDeadline
	if req.TimeoutSeconds > 0 {
		deadline = min(time.Duration(req.TimeoutSeconds*float64(time.Second)), maxRunDeadline)
	}
	r := &run{id: runIDOr(ctx), sandbox: id, boot: bootID(id, rt), rt: rt, expires: time.Now().Add(deadline), started: make(chan struct{})}
	tok, err := tokens.Mint(secrets.RunClaims{
		Tenant: h.Owner(), Sandbox: id, Run: r.id, Boot: r.boot,
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(r.expires)},
	})
	if err != nil {
		return nil, err
	}
	req.Env[api.RunTokenEnv] = tok
	m.mu.Lock()
	if m.runs == nil {
		m.runs = map[string]*run{}
	}
	m.runs[r.id] = r
	m.mu.Unlock()
	return r, nil
}

func containsNUL(b []byte) bool {
	for _, c := range b {
		if c == 0 {
			return true
		}
	}
	return false
}

// rememberSecrets adds values to the set redacted from sandbox id's output
// (forgotten when the sandbox is deleted, OnDelete).
func (m *Secrets) rememberSecrets(id string, values map[string][]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used == nil {
		m.used = map[string]map[string][]byte{}
	}
	set := m.used[id]
	if set == nil {
		set = map[string][]byte{}
		m.used[id] = set
	}
	for name, v := range values {
		key := name
		// A secret updated between runs: keep redacting the old value too.
		for i := 2; set[key] != nil && string(set[key]) != string(v); i++ {
			key = fmt.Sprintf("%s#%d", name, i)
		}
		set[key] = v
	}
}

// Redactor returns a new redactor of sandbox id's output: the values its
// runs were given so far (nil: nothing to redact).
func (m *Secrets) Redactor(id string) *redact.Redactor {
	m.mu.Lock()
	set := m.used[id]
	values := make(map[string][]byte, len(set))
	for k, v := range set {
		values[k] = v
	}
	m.mu.Unlock()
	if len(values) == 0 {
		return nil
	}
	return redact.New(values)
}

// endRun revokes r's token.
func (m *Secrets) endRun(r *run) {
	if r == nil {
		return
	}
	m.mu.Lock()
	delete(m.runs, r.id)
	m.mu.Unlock()
}

// followRun ends r when process pid exits (or its sandbox's guest goes
// away). It does not depend on any client staying attached.
func (m *Secrets) followRun(h *sandbox.Handle, r *run, pid int) {
	if r == nil {
		return
	}
	m.setRunPid(r, pid)
	g := h.Guest()
	if g == nil {
		m.endRun(r)
		return
	}
	go func() {
		defer m.endRun(r)
		ctx, cancel := context.WithDeadline(context.Background(), r.expires)
		defer cancel()
		s, err := g.Attach(ctx, pid, false)
		if err != nil {
			return
		}
		defer s.Close()
		for {
			ev, err := s.Next()
			if err != nil || ev.Type == api.EventExit || ev.Type == api.EventError {
				return
			}
		}
	}()
}

// AuthorizeRun verifies a run token presented by a program inside sandbox
// sandboxID (the identity of the tunnel the request arrived on): signature,
// algorithm, issuer, audience, type and expiry, then that the token was
// minted for this very sandbox, in its current boot, for a run that is
// still live. Every failure wraps errdefs.ErrUnauthenticated.
func (m *Secrets) AuthorizeRun(ctx context.Context, sandboxID, token string) (secrets.RunClaims, error) {
	tokens := m.tokens
	if tokens == nil {
		return secrets.RunClaims{}, fmt.Errorf("run tokens are not configured: %w", errdefs.ErrUnauthenticated)
	}
	c, err := tokens.Verify(token)
	if err != nil {
		return secrets.RunClaims{}, err
	}
	deny := func(why string) (secrets.RunClaims, error) {
		return secrets.RunClaims{}, fmt.Errorf("run token rejected: %s: %w", why, errdefs.ErrUnauthenticated)
	}
	if c.Sandbox != sandboxID {
		return deny("minted for another sandbox")
	}
	h, err := m.core.Handle(ctx, sandboxID)
	if err != nil {
		return deny("sandbox is gone")
	}
	rt := h.Runtime()
	if !h.Live() {
		return deny("sandbox is not running")
	}
	m.mu.Lock()
	r := m.runs[c.Run]
	if r != nil && time.Now().After(r.expires) {
		delete(m.runs, r.id)
		r = nil
	}
	m.mu.Unlock()
	switch {
	case r == nil:
		return deny("run has ended")
	case r.sandbox != sandboxID || r.rt != rt || r.boot != c.Boot || bootID(sandboxID, rt) != c.Boot:
		return deny("sandbox was restarted since the token was minted")
	}
	return c, nil
}

// bootID identifies one start of a sandbox's guest: the backend's state
// carries the guest's pid and start time, so it differs after every start
// (recovery, restore) and between sandboxes.
func bootID(id string, rt runtime.Sandbox) string {
	h := sha256.New()
	h.Write([]byte(id))
	h.Write([]byte{0})
	if rt != nil {
		h.Write(rt.State())
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// runIDOr returns the run id ctx carries (sandbox.WithRunID), or a fresh
// one.
func runIDOr(ctx context.Context) string {
	if id := sandbox.RunIDFrom(ctx); id != "" {
		return id
	}
	return newRunID()
}

func newRunID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "run_" + hex.EncodeToString(b[:])
}
