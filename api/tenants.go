package api

import "time"

// Tenancy: every object (sandbox, checkpoint, template, secret, schedule,
// hook, run) belongs to a tenant. A caller sees only its own tenant's
// objects: another tenant's ids get the same 404 as unknown ids and nothing
// happens to them. Templates of the admin tenant (builtins among them) are
// the platform's catalogue, usable by every tenant; a tenant's own templates
// and secrets live in a namespace of their own, so two tenants may both own
// a template or secret called "app".
//
// Callers on the daemon's unix socket are the admin tenant: they see and
// manage everything. TCP callers present an API key ("Authorization: Bearer
// abx_..."), which names one tenant and a scope.

// AdminTenant is the tenant of the unix socket and of the daemon's own
// objects.
const AdminTenant = "admin"

// API key scopes.
const (
	// ScopeFull may call every route of its tenant.
	ScopeFull = "full"
	// ScopeRead may call only read routes (GET): list, inspect, read files,
	// attach to output, runs and usage.
	ScopeRead = "read"
)

// Quotas bound what one tenant may hold or use; a zero field is unlimited.
// Going over a quota fails the request with 429 and a Retry-After header.
type Quotas struct {
	// MaxSandboxes bounds the tenant's concurrent sandboxes (every state
	// but deleted).
	MaxSandboxes int `json:"max_sandboxes,omitempty"`
	// CPUSeconds bounds the CPU time the tenant's runs may use per period
	// (metered like GET /v1/usage). When it is spent, create and exec fail
	// until the period ends.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	// PeriodSeconds is the length of the CPU period, aligned to the Unix
	// epoch; 0 means 3600 (an hour).
	PeriodSeconds int64 `json:"period_seconds,omitempty"`
	// DiskBytes bounds the disk the tenant holds: the sum of the disk
	// limits (writable-layer sizes) of its sandboxes plus the bytes on
	// disk of the layers of its checkpoints and templates (saved, built
	// and imported). A sandbox of such a tenant always has a disk limit:
	// a create that sets none gets DefaultTenantDiskBytes (or what is
	// left of the quota, when less). A checkpoint, template save, build
	// or import that would take it over fails.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// DefaultTenantDiskBytes is the disk limit of a sandbox created without one
// by a tenant that has a disk quota.
const DefaultTenantDiskBytes = 1 << 30

// DefaultQuotaPeriodSeconds is the CPU period when Quotas.PeriodSeconds is 0.
const DefaultQuotaPeriodSeconds = 3600

// Tenant is one tenant.
type Tenant struct {
	// ID names the tenant: ^[a-z0-9][a-z0-9-]{0,31}$, "admin" is reserved.
	ID        string    `json:"id"`
	Quotas    Quotas    `json:"quotas"`
	CreatedAt time.Time `json:"created_at"`
	// Usage is what counts against the quotas now (GET of one tenant only).
	Usage *TenantQuotaUsage `json:"usage,omitempty"`
}

// TenantQuotaUsage is what a tenant holds and used in the current period.
type TenantQuotaUsage struct {
	Sandboxes  int     `json:"sandboxes"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// DiskBytes is what counts against Quotas.DiskBytes: the disk limits
	// of the tenant's sandboxes plus LayerBytes.
	DiskBytes int64 `json:"disk_bytes"`
	// LayerBytes is the part of DiskBytes held by the tenant's
	// checkpoints and templates: the bytes on disk of the layers in their
	// chains, each layer once, the shared catalogue's not at all.
	LayerBytes   int64     `json:"layer_bytes"`
	PeriodStart  time.Time `json:"period_start"`
	PeriodEndsAt time.Time `json:"period_ends_at"`
}

// TenantList is the body of GET /v1/tenants.
type TenantList struct {
	Tenants []Tenant `json:"tenants"`
}

// CreateTenantRequest is the body of POST /v1/tenants.
type CreateTenantRequest struct {
	ID     string `json:"id"`
	Quotas Quotas `json:"quotas,omitempty"`
}

// UpdateTenantRequest is the body of PATCH /v1/tenants/{tenant}: the new
// quotas replace the old ones.
type UpdateTenantRequest struct {
	Quotas Quotas `json:"quotas"`
}

// APIKey describes an API key; the key itself is shown only once, when it
// is created (CreatedAPIKey). The daemon keeps only a hash of it.
type APIKey struct {
	// ID is the key's public id, also the second part of the key
	// ("abx_<id>_<secret>").
	ID        string     `json:"id"`
	Tenant    string     `json:"tenant"`
	Scope     string     `json:"scope"`
	Name      string     `json:"name,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// APIKeyList is the body of GET /v1/keys.
type APIKeyList struct {
	Keys []APIKey `json:"keys"`
}

// CreateAPIKeyRequest is the body of POST /v1/keys. Tenant defaults to the
// caller's own; only the admin tenant may name another one.
type CreateAPIKeyRequest struct {
	Tenant string `json:"tenant,omitempty"`
	// Scope is ScopeFull (the default) or ScopeRead.
	Scope string `json:"scope,omitempty"`
	// Name is a free-form label (at most 128 bytes).
	Name string `json:"name,omitempty"`
}

// CreatedAPIKey is the answer to POST /v1/keys: the only time the key is
// shown.
type CreatedAPIKey struct {
	APIKey
	Key string `json:"key"`
}
