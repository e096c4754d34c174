package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// CreateSandbox creates and starts a sandbox; see CreateOrGetSandbox.
func (m *Manager) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	sb, _, err := m.CreateOrGetSandbox(ctx, req)
	return sb, err
}

// CreateOrGetSandbox creates and starts a sandbox from a template with the
// lifecycle preset and idle policy req asks for. When req names a
// sandbox that exists (names are unique among a tenant's live sandboxes),
// that one is returned instead, woken (restarted if its guest had
// stopped), and created is false; when req explicitly asks for options
// the existing sandbox does not have (template, runtime, resources,
// lifecycle, idle policy, network, env, labels, hostname, timeout), it is
// ErrConflict naming every option that differs, and nothing changes. It
// returns once the sandbox's guest answers. On error nothing of a new
// sandbox is left behind.
func (m *Manager) CreateOrGetSandbox(ctx context.Context, req api.CreateSandboxRequest) (_ api.Sandbox, created bool, _ error) {
	asked := req // the options as asked, before defaults fill them in
	if req.Runtime == "" {
		req.Runtime = m.templateRuntime(ctx, req.Template)
	}
	if _, err := m.resolveRuntime(&req); err != nil {
		return api.Sandbox{}, false, fmt.Errorf("creating sandbox: %w", err)
	}
	if err := m.resolveLifecycle(&req); err != nil {
		return api.Sandbox{}, false, fmt.Errorf("creating sandbox: %w", err)
	}
	if req.Name == "" {
		sb, err := m.createSandbox(ctx, req)
		return sb, err == nil, err
	}
	m.lc.nameMu.Lock()
	defer m.lc.nameMu.Unlock()
	b := m.byName(tenant.From(ctx).Tenant, req.Name)
	if b == nil {
		sb, err := m.createSandbox(ctx, req)
		return sb, err == nil, err
	}
	sb := b.view()
	if diff := m.optionsDiffer(ctx, asked, req, sb); len(diff) > 0 {
		return api.Sandbox{}, false, fmt.Errorf("sandbox %q exists with other options: %s (delete it, or create it under another name): %w",
			req.Name, strings.Join(diff, "; "), errdefs.ErrConflict)
	}
	b.life.Lock()
	err := m.wakeLocked(ctx, b, api.CauseWake, "create by name", true)
	b.life.Unlock()
	if err != nil {
		return api.Sandbox{}, false, err
	}
	m.log.InfoContext(ctx, "sandbox reused by name", "sandbox", sb.ID, "name", req.Name)
	return b.view(), false, nil
}

// byName returns owner's live sandbox named name, or nil. Names are
// unique per tenant: two tenants may each have a sandbox "dev".
func (m *Manager) byName(owner, name string) *box {
	owner = tenant.Owner(owner)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range m.sandboxes {
		b.mu.Lock()
		match := !b.deleted && b.rec.Sandbox.Name == name && tenant.Owner(b.rec.Sandbox.Tenant) == owner
		b.mu.Unlock()
		if match {
			return b
		}
	}
	return nil
}

// adoptAsleep re-adopts a paused or hibernated sandbox at start-up. A
// paused one stays frozen (its guest is checked to be the same process in
// its cgroup, not pinged: it cannot answer); a hibernated one has nothing
// to adopt and wakes on its first use.
func (m *Manager) adoptAsleep(ctx context.Context, rec store.SandboxRecord) error {
	b := &box{rec: rec}
	if rec.Sandbox.State == api.StatePaused {
		be, err := m.backendOf(rec)
		if err != nil {
			return err
		}
		rt, err := be.Recover(ctx, m.runtimeSpec(rec), rec.RuntimeState)
		if err != nil {
			return err
		}
		// A daemon that died mid-pause may have left it thawed.
		if p, ok := rt.(runtime.Pauser); ok {
			if err := p.Pause(ctx); err != nil {
				_ = rt.Destroy(context.WithoutCancel(ctx))
				return fmt.Errorf("freezing: %w", err)
			}
		}
		b.rt, b.guest = rt, client.New(rt.SocketPath())
		b.rec.RuntimeState = rt.State()
	}
	if err := m.register(b); err != nil {
		return err
	}
	m.onRecover(ctx, b)
	return nil
}

// keepCold keeps a persistent sandbox whose guest is gone (a host reboot,
// a crash mid-hibernate) as hibernated instead of reaping it: its
// filesystem is what a persistent sandbox promises to keep. It reports
// whether it did.
func (m *Manager) keepCold(ctx context.Context, rec store.SandboxRecord, why error) bool {
	if rec.Sandbox.Lifecycle != api.LifecyclePersistent {
		return false
	}
	switch rec.Sandbox.State {
	case api.StateRunning, api.StatePaused, api.StateStopped, api.StateHibernated:
	default:
		return false
	}
	id := rec.Sandbox.ID
	if err := m.cleanupRuntime(ctx, rec); err != nil {
		m.log.WarnContext(ctx, "cleaning up after a lost guest", "sandbox", id, "err", err)
		return false
	}
	b := &box{rec: rec}
	b.rec.RuntimeState = nil
	if rec.Sandbox.State != api.StateHibernated {
		m.setStateLocked(b, api.StateHibernated, api.CauseRecover, "guest gone at daemon start")
	}
	if err := m.saveLocked(ctx, b); err != nil {
		m.log.WarnContext(ctx, "keeping persistent sandbox", "sandbox", id, "err", err)
		return false
	}
	if err := m.register(b); err != nil {
		return false
	}
	m.onRecover(ctx, b)
	m.log.WarnContext(ctx, "persistent sandbox's guest is gone; kept hibernated", "sandbox", id, "err", why)
	return true
}

// optionsDiffer lists the options asked explicitly for (asked: the
// request as sent; resolved: with the lifecycle and runtime resolved)
// that existing sandbox sb does not have, one "option: has X, asked for Y"
// each. Options left out of the request are never compared.
func (m *Manager) optionsDiffer(ctx context.Context, asked, resolved api.CreateSandboxRequest, sb api.Sandbox) []string {
	var diff []string
	differ := func(option string, has, want any) {
		diff = append(diff, fmt.Sprintf("%s: has %v, asked for %v", option, has, want))
	}
	if asked.Template != "" && asked.Template != sb.Template {
		differ("template", sb.Template, asked.Template)
	}
	if asked.Runtime != "" && resolved.Runtime != sb.Backend {
		differ("runtime", sb.Backend, resolved.Runtime)
	}
	if asked.Lifecycle != "" && asked.Lifecycle != sb.Lifecycle {
		differ("lifecycle", sb.Lifecycle, asked.Lifecycle)
	}
	if asked.Idle != nil && sb.Idle != nil {
		// The overrides asked for, over the preset of the lifecycle the
		// sandbox would have (its own when none is asked for).
		want := api.CreateSandboxRequest{Lifecycle: cmp.Or(asked.Lifecycle, sb.Lifecycle), Idle: asked.Idle, Runtime: sb.Backend}
		if err := m.resolveLifecycle(&want); err == nil && *want.Idle != *sb.Idle {
			differ("idle", idleString(*sb.Idle), idleString(*want.Idle))
		}
	}
	has, want := sb.Resources, asked.Resources
	for _, r := range []struct {
		option    string
		has, want any
		asked     bool
	}{
		{"cpus", has.CPUs, want.CPUs, want.CPUs != 0},
		{"memory_bytes", has.MemoryBytes, want.MemoryBytes, want.MemoryBytes != 0},
		{"pids_max", has.PidsMax, want.PidsMax, want.PidsMax != 0},
		{"disk_bytes", has.DiskBytes, want.DiskBytes, want.DiskBytes != 0},
		{"disk_inodes", has.DiskInodes, want.DiskInodes, want.DiskInodes != 0},
		{"open_files", has.OpenFiles, want.OpenFiles, want.OpenFiles != 0},
	} {
		if r.asked && r.has != r.want {
			differ(r.option, r.has, r.want)
		}
	}
	for k, v := range asked.Env {
		if cur, ok := sb.Env[k]; !ok || cur != v {
			diff = append(diff, fmt.Sprintf("env: %s differs", k))
		}
	}
	if asked.Labels != nil && !maps.Equal(asked.Labels, sb.Labels) {
		differ("labels", sb.Labels, asked.Labels)
	}
	if asked.Hostname != "" && asked.Hostname != sb.Hostname {
		differ("hostname", sb.Hostname, asked.Hostname)
	}
	if asked.TimeoutSeconds != 0 {
		var cur int64
		if sb.ExpiresAt != nil {
			cur = int64(sb.ExpiresAt.Sub(sb.CreatedAt).Round(time.Second) / time.Second)
		}
		if cur != asked.TimeoutSeconds {
			differ("timeout_seconds", cur, asked.TimeoutSeconds)
		}
	}
	if asked.Network != nil {
		// Compared as the create would store it (normalised by the
		// network extension).
		cp := api.CreateSandboxRequest{Network: asked.Network}
		if err := m.prepare(ctx, &cp); err != nil {
			diff = append(diff, fmt.Sprintf("network: %v", err))
		} else if a, b := jsonOf(cp.Network), jsonOf(sb.Network); a != b {
			differ("network", b, a)
		}
	}
	return diff
}

func idleString(p api.IdlePolicy) string {
	s := fmt.Sprintf("pause after %ds, hibernate after %ds, delete after %ds", p.PauseAfterSeconds, p.HibernateAfterSeconds, p.DeleteAfterSeconds)
	if p.TTLCountsAsleep {
		s += ", ttl counts asleep"
	}
	if p.IgnoreBackground {
		s += ", ignoring background processes"
	}
	return s
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v) // plain structs of strings and numbers
	if string(b) == "null" {
		return "{}"
	}
	return string(b)
}

// ResolveSandbox returns the id of the sandbox ref designates for the
// caller of ctx: ref itself when it is the id of a sandbox the caller
// sees, else the id of the caller's own live sandbox named ref. Anything
// else (an unknown ref, another tenant's name) is returned unchanged, so
// that the call it is passed to reports it not found exactly like an
// unknown id. Ids and names cannot be mistaken for each other: a name
// never has the shape of an id (ValidName).
func (m *Manager) ResolveSandbox(ctx context.Context, ref string) string {
	if _, err := m.get(ctx, ref); err == nil {
		return ref
	}
	if b := m.byName(tenant.From(ctx).Tenant, ref); b != nil && !b.isHidden() {
		return b.id()
	}
	return ref
}

// ValidName checks a sandbox name: the shape of an id
// (^[a-z0-9][a-z0-9-]{0,63}$) without being one that newID could make
// (12 characters of [a-z0-9]), so that a name is never another sandbox's
// id.
func ValidName(name string) error {
	if !idRE.MatchString(name) {
		return fmt.Errorf("name %q must match %s: %w", name, idRE, errdefs.ErrInvalidArgument)
	}
	if looksLikeID(name) {
		return fmt.Errorf("name %q could be read as a sandbox id (12 letters and digits): add a hyphen or change its length: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// looksLikeID reports whether s has the shape of the ids newID makes.
func looksLikeID(s string) bool {
	if len(s) != idLen {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
