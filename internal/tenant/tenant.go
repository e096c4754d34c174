// Package tenant is agentbox's multi-tenancy: who is calling (Principal,
// carried in the request context), which objects a caller may see, and how
// a tenant's named objects are kept apart from another's (Qualify). The
// registry of tenants and API keys and the per-tenant quotas are in
// internal/tenant/registry, which persists them in the store; this package
// depends on no store, so the HTTP edge can name the caller without one.
//
// The rule every object follows: a caller sees only its own tenant's
// objects, and another tenant's ids are answered exactly like unknown ids.
// The admin tenant (the unix socket, and the daemon's own work) sees
// everything; its templates are the catalogue every tenant can use.
package tenant

import (
	"context"
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// Principal is the authenticated caller of a request.
type Principal struct {
	// Tenant is the caller's tenant; api.AdminTenant for the unix socket.
	Tenant string
	// Scope is api.ScopeFull or api.ScopeRead.
	Scope string
	// KeyID is the API key the caller presented ("" for the unix socket
	// and for keys of the daemon's keys file).
	KeyID string
}

// Admin is the principal of the unix socket and of the daemon itself.
var Admin = Principal{Tenant: api.AdminTenant, Scope: api.ScopeFull}

// IsAdmin reports whether p is the admin tenant.
func (p Principal) IsAdmin() bool { return p.Tenant == api.AdminTenant }

// CanWrite reports whether p's scope allows changes.
func (p Principal) CanWrite() bool { return p.Scope != api.ScopeRead }

// Sees reports whether p may see an object owned by owner. The admin sees
// every tenant's objects; an empty owner is the admin's (records written
// before tenancy existed).
func (p Principal) Sees(owner string) bool {
	return p.IsAdmin() || p.Tenant == Owner(owner)
}

// Owner normalises an object's recorded owner: "" is the admin tenant.
func Owner(owner string) string {
	if owner == "" {
		return api.AdminTenant
	}
	return owner
}

// String names p for run records and logs: "admin", "tenant:<id>" or
// "tenant:<id>/key:<key id>".
func (p Principal) String() string {
	if p.IsAdmin() && p.KeyID == "" {
		return api.AdminTenant
	}
	s := "tenant:" + p.Tenant
	if p.KeyID != "" {
		s += "/key:" + p.KeyID
	}
	return s
}

type principalKey struct{}

// WithPrincipal returns a context carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// From returns the principal of ctx. A context without one belongs to the
// daemon's own work (recovery, idle timers, the bridge), which acts as the
// admin; the API edge always sets one.
func From(ctx context.Context) Principal {
	if p, ok := ctx.Value(principalKey{}).(Principal); ok {
		return p
	}
	return Admin
}

// idRE is the shape of a tenant id.
var idRE = lazyregexp.New(`^[a-z0-9][a-z0-9-]{0,31}$`)

// ValidID checks the shape of a tenant id.
func ValidID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("tenant id %q: want ^[a-z0-9][a-z0-9-]{0,31}$: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// sep separates a tenant from a name in a qualified name. Names given by
// clients never contain it (the edge validates them), so a qualified name
// cannot be forged.
const sep = "~"

// Qualify returns the stored form of a name that tenant gave one of its
// named objects (template, secret, sandbox name): the admin's names are
// stored as given, every other tenant's as "<tenant>~<name>". Two tenants
// may therefore use the same name without seeing each other.
func Qualify(tenant, name string) string {
	if Owner(tenant) == api.AdminTenant {
		return name
	}
	return tenant + sep + name
}

// Split returns the owner and the tenant-visible name of a stored name.
func Split(qname string) (owner, name string) {
	if t, n, ok := strings.Cut(qname, sep); ok {
		return t, n
	}
	return api.AdminTenant, qname
}

// Visible returns the name under which p sees the stored name qname: its
// own names unqualified; the admin sees other tenants' names qualified.
func (p Principal) Visible(qname string) string {
	owner, name := Split(qname)
	if owner == p.Tenant {
		return name
	}
	return qname
}

// Lookup returns the stored names to try, in order, when p refers to an
// object by name: its own first, then the admin's catalogue (when shared,
// as templates are). A name that already carries a qualifier is only
// valid for the admin.
func (p Principal) Lookup(name string, shared bool) []string {
	if strings.Contains(name, sep) {
		if p.IsAdmin() {
			return []string{name}
		}
		return nil
	}
	if p.IsAdmin() {
		return []string{name}
	}
	if shared {
		return []string{Qualify(p.Tenant, name), name}
	}
	return []string{Qualify(p.Tenant, name)}
}
