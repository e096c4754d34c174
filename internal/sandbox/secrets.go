package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/runtime"
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
// The token is usable only while the run is live: the Manager keeps the set
// of live runs (in memory; a daemon restart ends them all) and drops a run
// when its process exits, its deadline passes, its sandbox is deleted or
// restarted (restore), so forks and restores never inherit a usable token.

const (
	maxExecSecrets     = 32
	defaultRunDeadline = time.Hour
	maxRunDeadline     = 24 * time.Hour
	// DefaultTenant is the tenant of runs of no other tenant.
	DefaultTenant = api.AdminTenant
)

// SecretStore is the host-side secret store (internal/secrets.Store).
type SecretStore interface {
	Put(ctx context.Context, name string, value []byte) (api.SecretInfo, error)
	Secret(ctx context.Context, name string) ([]byte, error)
	List(ctx context.Context) ([]api.SecretInfo, error)
	Delete(ctx context.Context, name string) error
}

// secretState is the Manager's state for secrets, run tokens and the
// events the bridge brings in from sandboxes (events.go).
type secretState struct {
	// mu guards the fields below.
	mu     sync.Mutex
	store  SecretStore
	tokens *secrets.Tokens
	// used holds, per sandbox id, the secret values its runs were given.
	used map[string]map[string][]byte
	// runs are the live runs holding a token, by run id.
	runs map[string]*run
	// events are the bridge events of each sandbox, oldest first.
	events map[string][]api.SandboxEvent
}

// run is one live exec that holds a token.
type run struct {
	id, sandbox, boot string
	rt                runtime.Sandbox // the sandbox's runtime instance at mint time
	expires           time.Time
	pid               int           // the process, once started (guarded by secretState.mu)
	started           chan struct{} // closed when pid is set
}

// SetSecrets connects the secret store and the run-token minter. Without
// them, exec requests naming secrets or asking for a token fail with
// ErrFailedPrecondition.
func (m *Manager) SetSecrets(st SecretStore, tokens *secrets.Tokens) {
	m.sec.mu.Lock()
	defer m.sec.mu.Unlock()
	m.sec.store, m.sec.tokens = st, tokens
}

func (m *Manager) secretStore() (SecretStore, error) {
	m.sec.mu.Lock()
	defer m.sec.mu.Unlock()
	if m.sec.store == nil {
		return nil, fmt.Errorf("no secret store is configured: %w", errdefs.ErrFailedPrecondition)
	}
	return m.sec.store, nil
}

// PutSecret stores a secret value (write-only: no method returns it to a
// client).
func (m *Manager) PutSecret(ctx context.Context, name string, value []byte) (api.SecretInfo, error) {
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
func (m *Manager) ListSecrets(ctx context.Context) ([]api.SecretInfo, error) {
	st, err := m.secretStore()
	if err != nil {
		return nil, err
	}
	return st.List(ctx)
}

// DeleteSecret removes a secret. Values already given to runs stay
// redacted from those sandboxes' output.
func (m *Manager) DeleteSecret(ctx context.Context, name string) error {
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

// prepareRun resolves req's secrets into req.Env and, when req.Token is
// set, mints the run's token into it and registers the run as live. It
// clears req.Secrets and req.Token, which the guest never sees. On error
// nothing is registered. The caller ends the returned run (nil when no
// token) if the process does not start.
func (m *Manager) prepareRun(ctx context.Context, b *box, req *api.ExecRequest) (*run, error) {
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
	m.sec.mu.Lock()
	st, tokens := m.sec.store, m.sec.tokens
	m.sec.mu.Unlock()
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
		v, err := st.Secret(tenant.WithPrincipal(ctx, tenant.Principal{Tenant: b.owner(), Scope: api.ScopeFull}), s.Name)
		if err != nil {
			return nil, err
		}
		if len(v) > validate.MaxValueLen || containsNUL(v) {
			return nil, fmt.Errorf("secret %s cannot be placed in an environment variable (NUL byte or over %d bytes): %w", s.Name, validate.MaxValueLen, errdefs.ErrInvalidArgument)
		}
		req.Env[env] = string(v)
		values[s.Name] = v
	}
	id := b.rec.Sandbox.ID
	if len(values) > 0 {
		m.rememberSecrets(id, values)
	}
	if !token {
		return nil, nil
	}
	b.mu.Lock()
	rt := b.rt
	b.mu.Unlock()
	deadline := defaultRunDeadline
	if req.TimeoutSeconds > 0 {
		deadline = min(time.Duration(req.TimeoutSeconds*float64(time.Second)), maxRunDeadline)
	}
	r := &run{id: runIDOr(ctx), sandbox: id, boot: bootID(id, rt), rt: rt, expires: time.Now().Add(deadline), started: make(chan struct{})}
	tok, err := tokens.Mint(secrets.RunClaims{
		Tenant: b.owner(), Sandbox: id, Run: r.id, Boot: r.boot,
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(r.expires)},
	})
	if err != nil {
		return nil, err
	}
	req.Env[api.RunTokenEnv] = tok
	m.sec.mu.Lock()
	if m.sec.runs == nil {
		m.sec.runs = map[string]*run{}
	}
	m.sec.runs[r.id] = r
	m.sec.mu.Unlock()
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

// rememberSecrets adds values to the set redacted from sandbox id's output,
// and forgets the sets of sandboxes that no longer exist.
func (m *Manager) rememberSecrets(id string, values map[string][]byte) {
	m.mu.Lock()
	live := make(map[string]bool, len(m.sandboxes))
	for sid := range m.sandboxes {
		live[sid] = true
	}
	m.mu.Unlock()
	m.sec.mu.Lock()
	defer m.sec.mu.Unlock()
	if m.sec.used == nil {
		m.sec.used = map[string]map[string][]byte{}
	}
	for sid := range m.sec.used {
		if !live[sid] {
			delete(m.sec.used, sid)
		}
	}
	set := m.sec.used[id]
	if set == nil {
		set = map[string][]byte{}
		m.sec.used[id] = set
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

// redactor returns the redactor of sandbox id's output (nil: nothing to
// redact).
func (m *Manager) redactor(id string) *redact.Redactor {
	m.sec.mu.Lock()
	set := m.sec.used[id]
	values := make(map[string][]byte, len(set))
	for k, v := range set {
		values[k] = v
	}
	m.sec.mu.Unlock()
	if len(values) == 0 {
		return nil
	}
	return redact.New(values)
}

// endRun revokes r's token.
func (m *Manager) endRun(r *run) {
	if r == nil {
		return
	}
	m.sec.mu.Lock()
	delete(m.sec.runs, r.id)
	m.sec.mu.Unlock()
}

// followRun ends r when process pid exits (or its sandbox's guest goes
// away). It does not depend on any client staying attached.
func (m *Manager) followRun(b *box, r *run, pid int) {
	if r == nil {
		return
	}
	m.setRunPid(r, pid)
	b.mu.Lock()
	g := b.guest
	b.mu.Unlock()
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
func (m *Manager) AuthorizeRun(ctx context.Context, sandboxID, token string) (secrets.RunClaims, error) {
	m.sec.mu.Lock()
	tokens := m.sec.tokens
	m.sec.mu.Unlock()
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
	b, err := m.get(ctx, sandboxID)
	if err != nil {
		return deny("sandbox is gone")
	}
	b.mu.Lock()
	rt, deleted, state := b.rt, b.deleted, b.rec.Sandbox.State
	b.mu.Unlock()
	if deleted || state != api.StateRunning {
		return deny("sandbox is not running")
	}
	m.sec.mu.Lock()
	r := m.sec.runs[c.Run]
	if r != nil && time.Now().After(r.expires) {
		delete(m.sec.runs, r.id)
		r = nil
	}
	m.sec.mu.Unlock()
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

func newRunID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "run_" + hex.EncodeToString(b[:])
}
