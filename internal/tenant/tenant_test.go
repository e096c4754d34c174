package tenant

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestPrincipalIsAdminCanWrite(t *testing.T) {
	for _, tc := range []struct {
		p                 Principal
		isAdmin, canWrite bool
	}{
		{Admin, true, true},
		{Principal{Tenant: api.AdminTenant, Scope: api.ScopeRead, KeyID: "k"}, true, false},
		{Principal{Tenant: "acme", Scope: api.ScopeFull}, false, true},
		{Principal{Tenant: "acme", Scope: api.ScopeRead}, false, false},
		// An empty scope is not "read": CanWrite only refuses read keys.
		{Principal{Tenant: "acme"}, false, true},
	} {
		if got := tc.p.IsAdmin(); got != tc.isAdmin {
			t.Errorf("%+v.IsAdmin() = %v, want %v", tc.p, got, tc.isAdmin)
		}
		if got := tc.p.CanWrite(); got != tc.canWrite {
			t.Errorf("%+v.CanWrite() = %v, want %v", tc.p, got, tc.canWrite)
		}
	}
}

func TestPrincipalSees(t *testing.T) {
	acme := Principal{Tenant: "acme", Scope: api.ScopeFull}
	for _, tc := range []struct {
		p     Principal
		owner string
		want  bool
	}{
		{Admin, "", true},
		{Admin, api.AdminTenant, true},
		{Admin, "acme", true},
		{Admin, "other", true},
		{acme, "acme", true},
		{acme, "other", false},
		{acme, api.AdminTenant, false},
		// An empty owner is the admin's (records from before tenancy).
		{acme, "", false},
		// Read scope does not change what is visible.
		{Principal{Tenant: "acme", Scope: api.ScopeRead}, "acme", true},
		{Principal{Tenant: "acme", Scope: api.ScopeRead}, "other", false},
	} {
		if got := tc.p.Sees(tc.owner); got != tc.want {
			t.Errorf("%v.Sees(%q) = %v, want %v", tc.p, tc.owner, got, tc.want)
		}
	}
}

func TestOwner(t *testing.T) {
	if got := Owner(""); got != api.AdminTenant {
		t.Errorf("Owner(\"\") = %q, want %q", got, api.AdminTenant)
	}
	if got := Owner("acme"); got != "acme" {
		t.Errorf("Owner(acme) = %q", got)
	}
}

func TestPrincipalString(t *testing.T) {
	for _, tc := range []struct {
		p    Principal
		want string
	}{
		{Admin, "admin"},
		{Principal{Tenant: api.AdminTenant, Scope: api.ScopeRead}, "admin"},
		// An admin API key is named by its key, like any other.
		{Principal{Tenant: api.AdminTenant, Scope: api.ScopeFull, KeyID: "k1"}, "tenant:admin/key:k1"},
		{Principal{Tenant: "acme", Scope: api.ScopeFull}, "tenant:acme"},
		{Principal{Tenant: "acme", Scope: api.ScopeRead, KeyID: "abcdefghij012345"}, "tenant:acme/key:abcdefghij012345"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.p, got, tc.want)
		}
	}
}

func TestFromContext(t *testing.T) {
	if got := From(context.Background()); got != Admin {
		t.Errorf("From(empty ctx) = %+v, want Admin", got)
	}
	p := Principal{Tenant: "acme", Scope: api.ScopeRead, KeyID: "k"}
	ctx := WithPrincipal(context.Background(), p)
	if got := From(ctx); got != p {
		t.Errorf("From(WithPrincipal(p)) = %+v, want %+v", got, p)
	}
	// A derived context keeps the principal; a nested one overrides it.
	child, cancel := context.WithCancel(ctx)
	defer cancel()
	if got := From(child); got != p {
		t.Errorf("From(child) = %+v, want %+v", got, p)
	}
	q := Principal{Tenant: "other", Scope: api.ScopeFull}
	if got := From(WithPrincipal(child, q)); got != q {
		t.Errorf("From(nested) = %+v, want %+v", got, q)
	}
}

func TestValidID(t *testing.T) {
	good := []string{"a", "0", "acme", "team-1", "a-", "9lives", strings.Repeat("a", 32), api.AdminTenant}
	for _, id := range good {
		if err := ValidID(id); err != nil {
			t.Errorf("ValidID(%q) = %v, want nil", id, err)
		}
	}
	bad := []string{"", "-a", "Acme", "ACME", "a_b", "a.b", "a b", "a~b", "a/b", "é",
		strings.Repeat("a", 33), "acme\n", "\nacme", " acme"}
	for _, id := range bad {
		err := ValidID(id)
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidID(%q) = %v, want ErrInvalidArgument", id, err)
		}
	}
}

func TestQualifySplit(t *testing.T) {
	for _, tc := range []struct {
		tenant, name, want string
	}{
		{api.AdminTenant, "app", "app"},
		{"", "app", "app"},
		{"acme", "app", "acme~app"},
		{"other", "app", "other~app"},
	} {
		q := Qualify(tc.tenant, tc.name)
		if q != tc.want {
			t.Errorf("Qualify(%q, %q) = %q, want %q", tc.tenant, tc.name, q, tc.want)
		}
		owner, name := Split(q)
		if owner != Owner(tc.tenant) || name != tc.name {
			t.Errorf("Split(%q) = %q, %q; want %q, %q", q, owner, name, Owner(tc.tenant), tc.name)
		}
	}
	// Two tenants' equal names never collide, nor with the admin's.
	if Qualify("a", "x") == Qualify("b", "x") || Qualify("a", "x") == Qualify(api.AdminTenant, "x") {
		t.Error("qualified names of different tenants collide")
	}
	// Split cuts at the first separator.
	if owner, name := Split("acme~a~b"); owner != "acme" || name != "a~b" {
		t.Errorf("Split(acme~a~b) = %q, %q", owner, name)
	}
}

func TestVisible(t *testing.T) {
	acme := Principal{Tenant: "acme", Scope: api.ScopeFull}
	for _, tc := range []struct {
		p           Principal
		qname, want string
	}{
		{acme, "acme~app", "app"},
		{acme, "app", "app"}, // the admin catalogue
		{Admin, "app", "app"},
		{Admin, "acme~app", "acme~app"},
		{Admin, "other~app", "other~app"},
	} {
		if got := tc.p.Visible(tc.qname); got != tc.want {
			t.Errorf("%v.Visible(%q) = %q, want %q", tc.p, tc.qname, got, tc.want)
		}
	}
}

func TestLookup(t *testing.T) {
	acme := Principal{Tenant: "acme", Scope: api.ScopeFull}
	for _, tc := range []struct {
		name   string
		p      Principal
		lookup string
		shared bool
		want   []string
	}{
		{"admin plain", Admin, "app", false, []string{"app"}},
		{"admin plain shared", Admin, "app", true, []string{"app"}},
		{"admin qualified", Admin, "acme~app", false, []string{"acme~app"}},
		{"admin qualified shared", Admin, "acme~app", true, []string{"acme~app"}},
		{"tenant own", acme, "app", false, []string{"acme~app"}},
		{"tenant own then catalogue", acme, "app", true, []string{"acme~app", "app"}},
		// A tenant cannot reach another tenant's object (or its own) by a
		// qualified name: nothing to try at all.
		{"tenant forged other", acme, "other~app", false, nil},
		{"tenant forged other shared", acme, "other~app", true, nil},
		{"tenant forged own", acme, "acme~app", true, nil},
		{"tenant bare sep", acme, "~", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.p.Lookup(tc.lookup, tc.shared)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Lookup(%q, %v) = %q, want %q", tc.lookup, tc.shared, got, tc.want)
			}
			// Whatever a non-admin may try belongs to it or the admin.
			if !tc.p.IsAdmin() {
				for _, q := range got {
					if owner, _ := Split(q); owner != tc.p.Tenant && owner != api.AdminTenant {
						t.Errorf("Lookup offers %q, owned by %q", q, owner)
					}
				}
			}
		})
	}
}
