package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
)

// fakeTenancy is an in-memory daemon for the tenant and key routes that
// records every request (the agentboxtest fake has no such routes).
type fakeTenancy struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex // guards the fields below
	tenants map[string]api.Tenant
	keys    []api.APIKey
	reqs    []fakeRequest
}

type fakeRequest struct{ method, path, body string }

func newFakeTenancy(t *testing.T) *fakeTenancy {
	f := &fakeTenancy{t: t, tenants: map[string]api.Tenant{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/tenants", func(w http.ResponseWriter, r *http.Request) {
		list := api.TenantList{Tenants: []api.Tenant{}}
		for _, t := range f.tenants {
			list.Tenants = append(list.Tenants, t)
		}
		writeFakeJSON(w, http.StatusOK, list)
	})
	mux.HandleFunc("POST /v1/tenants", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateTenantRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeFakeJSON(w, http.StatusBadRequest, api.Error{Code: "invalid_argument", Message: err.Error()})
			return
		}
		t := api.Tenant{ID: req.ID, Quotas: req.Quotas, CreatedAt: time.Now()}
		f.tenants[t.ID] = t
		writeFakeJSON(w, http.StatusCreated, t)
	})
	withTenant := func(h func(http.ResponseWriter, *http.Request, api.Tenant)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			t, ok := f.tenants[r.PathValue("tenant")]
			if !ok {
				writeFakeJSON(w, http.StatusNotFound, api.Error{Code: "not_found", Message: "tenant " + r.PathValue("tenant") + " not found", RequestID: "req-7"})
				return
			}
			h(w, r, t)
		}
	}
	mux.HandleFunc("GET /v1/tenants/{tenant}", withTenant(func(w http.ResponseWriter, r *http.Request, t api.Tenant) {
		t.Usage = &api.TenantQuotaUsage{Sandboxes: 1, CPUSeconds: 2.5, DiskBytes: 4096}
		writeFakeJSON(w, http.StatusOK, t)
	}))
	mux.HandleFunc("PATCH /v1/tenants/{tenant}", withTenant(func(w http.ResponseWriter, r *http.Request, t api.Tenant) {
		var req api.UpdateTenantRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeFakeJSON(w, http.StatusBadRequest, api.Error{Code: "invalid_argument", Message: err.Error()})
			return
		}
		t.Quotas = req.Quotas
		f.tenants[t.ID] = t
		writeFakeJSON(w, http.StatusOK, t)
	}))
	mux.HandleFunc("DELETE /v1/tenants/{tenant}", withTenant(func(w http.ResponseWriter, r *http.Request, t api.Tenant) {
		delete(f.tenants, t.ID)
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("GET /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		writeFakeJSON(w, http.StatusOK, api.APIKeyList{Keys: append([]api.APIKey{}, f.keys...)})
	})
	mux.HandleFunc("POST /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateAPIKeyRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeFakeJSON(w, http.StatusBadRequest, api.Error{Code: "invalid_argument", Message: err.Error()})
			return
		}
		if req.Tenant == "" {
			req.Tenant = api.AdminTenant
		}
		if req.Scope == "" {
			req.Scope = api.ScopeFull
		}
		k := api.APIKey{ID: fmt.Sprintf("%016x", uint64(0x0123456789abcdef)+uint64(len(f.keys))), Tenant: req.Tenant, Scope: req.Scope, Name: req.Name, CreatedAt: time.Now()}
		f.keys = append(f.keys, k)
		writeFakeJSON(w, http.StatusCreated, api.CreatedAPIKey{APIKey: k, Key: "abx_" + k.ID + "_s3cret"})
	})
	mux.HandleFunc("DELETE /v1/keys/{key}", func(w http.ResponseWriter, r *http.Request) {
		for i, k := range f.keys {
			if k.ID == r.PathValue("key") && k.RevokedAt == nil {
				now := time.Now()
				f.keys[i].RevokedAt = &now
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		writeFakeJSON(w, http.StatusNotFound, api.Error{Code: "not_found", Message: "API key not found", RequestID: "req-8"})
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		f.mu.Lock()
		defer f.mu.Unlock()
		f.reqs = append(f.reqs, fakeRequest{r.Method, r.URL.EscapedPath(), string(b)})
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func writeFakeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// run runs the command line against the fake and returns stdout, stderr
// and the exit status.
func (f *fakeTenancy) run(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = execute(context.Background(), append([]string{"--host", f.srv.URL}, args...), strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

func (f *fakeTenancy) mustRun(args ...string) string {
	f.t.Helper()
	out, errOut, code := f.run(args...)
	if code != 0 {
		f.t.Fatalf("agentbox %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// requests returns the requests received so far and forgets them.
func (f *fakeTenancy) requests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.reqs
	f.reqs = nil
	return r
}

// tenant returns the stored tenant id, or a zero Tenant.
func (f *fakeTenancy) tenant(id string) api.Tenant {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tenants[id]
}

func TestTenantCreateLsInspect(t *testing.T) {
	f := newFakeTenancy(t)
	out := f.mustRun("tenant", "create", "acme", "--max-sandboxes", "5", "--cpu-seconds", "600", "--period", "1h", "--disk", "10G")
	if out != "acme\n" {
		t.Fatalf("tenant create printed %q, want the id", out)
	}
	reqs := f.requests()
	if len(reqs) != 1 || reqs[0].method != "POST" || reqs[0].path != "/v1/tenants" {
		t.Fatalf("tenant create sent %+v", reqs)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(reqs[0].body), &body); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(body); string(b) != `{"id":"acme","quotas":{"cpu_seconds":600,"disk_bytes":10737418240,"max_sandboxes":5,"period_seconds":3600}}` {
		t.Fatalf("tenant create body = %s", b)
	}
	// Without quota flags every quota is unlimited (nothing sent).
	f.mustRun("tenant", "create", "free")
	if r := f.requests(); len(r) != 1 || r[0].body != `{"id":"free","quotas":{}}` {
		t.Fatalf("tenant create without quotas sent %+v", r)
	}

	table := strings.Split(strings.TrimSpace(f.mustRun("tenant", "ls")), "\n")
	if len(table) != 3 || !strings.HasPrefix(table[0], "ID ") || !strings.Contains(table[0], "MAX SANDBOXES") ||
		!strings.Contains(table[0], "CPU-SECONDS/PERIOD") || !strings.Contains(table[0], "DISK") || !strings.Contains(table[0], "CREATED") {
		t.Fatalf("tenant ls:\n%s", strings.Join(table, "\n"))
	}
	rows := map[string][]string{}
	for _, line := range table[1:] {
		fs := strings.Fields(line)
		rows[fs[0]] = fs
	}
	if got := strings.Join(rows["acme"][:4], " "); got != "acme 5 600/1h 10.0GiB" {
		t.Errorf("acme row = %q", got)
	}
	if got := strings.Join(rows["free"][:4], " "); got != "free - - -" {
		t.Errorf("free row = %q, want - for unlimited", got)
	}

	var list api.TenantList
	if err := json.Unmarshal([]byte(f.mustRun("tenant", "ls", "--json")), &list); err != nil || len(list.Tenants) != 2 {
		t.Fatalf("tenant ls --json = %+v, %v", list, err)
	}

	var got api.Tenant
	if err := json.Unmarshal([]byte(f.mustRun("tenant", "inspect", "acme")), &got); err != nil ||
		got.ID != "acme" || got.Quotas.MaxSandboxes != 5 || got.Usage == nil || got.Usage.CPUSeconds != 2.5 {
		t.Fatalf("tenant inspect = %+v, %v", got, err)
	}
	_, errOut, code := f.run("tenant", "inspect", "nope")
	if code != exitAgentbox || errOut != "agentbox: getting tenant nope: tenant nope not found (request id req-7)\n" {
		t.Fatalf("tenant inspect nope: exit %d, %q", code, errOut)
	}

	f.requests()
	if _, errOut, code := f.run("tenant", "create", "bad", "--period", "1500ms"); code != exitAgentbox || !strings.Contains(errOut, "--period") {
		t.Fatalf("tenant create --period 1500ms: exit %d, %q", code, errOut)
	}
	if _, errOut, code := f.run("tenant", "create", "bad", "--disk", "lots"); code != exitAgentbox || !strings.Contains(errOut, "--disk") {
		t.Fatalf("tenant create --disk lots: exit %d, %q", code, errOut)
	}
	if _, _, code := f.run("tenant", "create", "bad", "--max-sandboxes", "-1"); code != exitAgentbox {
		t.Fatalf("tenant create --max-sandboxes -1: exit %d", code)
	}
	if r := f.requests(); len(r) != 0 {
		t.Fatalf("invalid flags still sent %+v", r)
	}

	if out, errOut, code := f.run("tenant", "rm", "free", "nope"); code != exitAgentbox || out != "" || !strings.Contains(errOut, "deleting tenant nope") {
		t.Fatalf("tenant rm free nope: exit %d, %q, %q", code, out, errOut)
	}
	if r := f.requests(); len(r) != 2 || r[0].method != "DELETE" || r[0].path != "/v1/tenants/free" {
		t.Fatalf("tenant rm sent %+v", r)
	}
	if f.tenant("free").ID != "" {
		t.Fatal("tenant rm left the tenant")
	}
}

func TestTenantSetChangesOnlyGivenFlags(t *testing.T) {
	f := newFakeTenancy(t)
	f.mustRun("tenant", "create", "acme", "--max-sandboxes", "5", "--cpu-seconds", "600", "--period", "1h", "--disk", "10G")
	f.requests()

	if out := f.mustRun("tenant", "set", "acme", "--max-sandboxes", "9"); out != "acme\n" {
		t.Fatalf("tenant set printed %q", out)
	}
	reqs := f.requests()
	if len(reqs) != 2 || reqs[0].method != "GET" || reqs[0].path != "/v1/tenants/acme" ||
		reqs[1].method != "PATCH" || reqs[1].path != "/v1/tenants/acme" {
		t.Fatalf("tenant set sent %+v, want GET then PATCH", reqs)
	}
	var patch api.UpdateTenantRequest
	if err := json.Unmarshal([]byte(reqs[1].body), &patch); err != nil {
		t.Fatal(err)
	}
	want := api.Quotas{MaxSandboxes: 9, CPUSeconds: 600, PeriodSeconds: 3600, DiskBytes: 10 << 30}
	if patch.Quotas != want {
		t.Fatalf("PATCH quotas = %+v, want %+v", patch.Quotas, want)
	}

	// 0 makes one quota unlimited and keeps the others.
	var got api.Tenant
	if err := json.Unmarshal([]byte(f.mustRun("--json", "tenant", "set", "acme", "--disk", "0", "--period", "30m")), &got); err != nil {
		t.Fatal(err)
	}
	want = api.Quotas{MaxSandboxes: 9, CPUSeconds: 600, PeriodSeconds: 1800}
	if got.Quotas != want || f.tenant("acme").Quotas != want {
		t.Fatalf("after set --disk 0 --period 30m: printed %+v, stored %+v, want %+v", got.Quotas, f.tenant("acme").Quotas, want)
	}

	f.requests()
	if _, errOut, code := f.run("tenant", "set", "acme"); code != exitAgentbox || !strings.Contains(errOut, "nothing to change") {
		t.Fatalf("tenant set without flags: exit %d, %q", code, errOut)
	}
	if _, errOut, code := f.run("tenant", "set", "nope", "--max-sandboxes", "1"); code != exitAgentbox || !strings.Contains(errOut, "not found") {
		t.Fatalf("tenant set nope: exit %d, %q", code, errOut)
	}
	if r := f.requests(); len(r) != 1 || r[0].method != "GET" {
		t.Fatalf("failed sets sent %+v, want only the GET of nope", r)
	}
}

func TestKeyCreateLsRevoke(t *testing.T) {
	f := newFakeTenancy(t)
	out, errOut, code := f.run("key", "create", "--tenant", "acme", "--scope", "read", "--name", "ci")
	if code != 0 || out != "abx_0123456789abcdef_s3cret\n" {
		t.Fatalf("key create: exit %d, stdout %q, want the key alone", code, out)
	}
	if strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "only") {
		t.Fatalf("key create stderr = %q, want a one-line warning", errOut)
	}
	reqs := f.requests()
	if len(reqs) != 1 || reqs[0].method != "POST" || reqs[0].path != "/v1/keys" ||
		reqs[0].body != `{"tenant":"acme","scope":"read","name":"ci"}` {
		t.Fatalf("key create sent %+v", reqs)
	}
	f.mustRun("key", "create")
	if r := f.requests(); len(r) != 1 || r[0].body != `{}` {
		t.Fatalf("key create with defaults sent %+v", r)
	}
	var created api.CreatedAPIKey
	if err := json.Unmarshal([]byte(f.mustRun("key", "create", "--json")), &created); err != nil ||
		created.Key != "abx_0123456789abcdf1_s3cret" || created.Scope != api.ScopeFull {
		t.Fatalf("key create --json = %+v, %v", created, err)
	}
	f.requests()

	if out := f.mustRun("key", "revoke", "0123456789abcdef"); out != "" {
		t.Fatalf("key revoke printed %q", out)
	}
	if r := f.requests(); len(r) != 1 || r[0].method != "DELETE" || r[0].path != "/v1/keys/0123456789abcdef" {
		t.Fatalf("key revoke sent %+v", r)
	}

	table := strings.Split(strings.TrimSpace(f.mustRun("key", "ls")), "\n")
	if len(table) != 4 || strings.Join(strings.Fields(table[0]), " ") != "ID TENANT SCOPE NAME CREATED REVOKED" {
		t.Fatalf("key ls:\n%s", strings.Join(table, "\n"))
	}
	if fs := strings.Fields(table[1]); strings.Join(fs[:4], " ") != "0123456789abcdef acme read ci" || fs[len(fs)-1] != "ago" {
		t.Fatalf("key ls revoked row = %q", table[1])
	}
	if fs := strings.Fields(table[2]); strings.Join(fs[:4], " ") != "0123456789abcdf0 admin full -" || fs[len(fs)-1] != "-" {
		t.Fatalf("key ls live row = %q", table[2])
	}
	var list api.APIKeyList
	if err := json.Unmarshal([]byte(f.mustRun("key", "ls", "--json")), &list); err != nil || len(list.Keys) != 3 || list.Keys[0].RevokedAt == nil {
		t.Fatalf("key ls --json = %+v, %v", list, err)
	}

	_, errOut, code = f.run("key", "revoke", "ffffffffffffffff")
	if code != exitAgentbox || errOut != "agentbox: revoking API key ffffffffffffffff: API key not found (request id req-8)\n" {
		t.Fatalf("key revoke of an unknown key: exit %d, %q", code, errOut)
	}
}
