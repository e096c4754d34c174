package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// tenancyDaemon starts a daemon with a TCP listener (tenants' keys only) and
// returns it with the listener's base URL.
func tenancyDaemon(t *testing.T) (*daemon, string) {
	t.Helper()
	addr := loopbackAddr(t)
	return newDaemonWith(t, "--tcp", addr), "http://" + addr
}

// tenantClient creates tenant id (with quotas) through the admin socket
// and returns an SDK client holding a new key of scope for it.
func tenantClient(t *testing.T, d *daemon, base, id string, q api.Quotas, scope string) (*agentbox.Client, api.CreatedAPIKey) {
	t.Helper()
	ctx := context.Background()
	if _, err := d.client.Tenant(ctx, id); agentbox.IsNotFound(err) {
		if _, err := d.client.CreateTenant(ctx, api.CreateTenantRequest{ID: id, Quotas: q}); err != nil {
			t.Fatalf("create tenant %s: %v", id, err)
		}
	}
	k, err := d.client.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: id, Scope: scope})
	if err != nil {
		t.Fatalf("create key for %s: %v", id, err)
	}
	c, err := agentbox.New(agentbox.WithHost(base), agentbox.WithAPIKey(k.Key))
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// rawCall sends one request with a bearer key and returns the status, the
// Retry-After header and the body.
func rawCall(t *testing.T, base, key, method, target string, body []byte) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, base+target, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if len(body) > 0 && (body[0] == '{' || body[0] == '[') {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := &http.Client{Timeout: time.Minute}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), b
}

// tenantObjects are tenant A's objects, which tenant B must not reach.
type tenantObjects struct {
	sandbox, sandbox2, checkpoint, template, secret, schedule, hook, run, tenant, key, exposure string
	pid                                                                                         int
}

// TestTenantIsolationEveryEndpoint replays every route of the API (read
// from the OpenAPI document the daemon serves, so a new route cannot be
// forgotten) with tenant B's key and tenant A's ids, and asserts that each
// answers exactly like the same request with unknown ids — 404 for
// tenant-owned objects, 403 for admin-only routes — and that nothing of
// A's changed.
func TestTenantIsolationEveryEndpoint(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	a, keyA := tenantClient(t, d, base, "tenant-a", api.Quotas{}, api.ScopeFull)
	b, keyB := tenantClient(t, d, base, "tenant-b", api.Quotas{}, api.ScopeFull)

	// Tenant A's objects: two sandboxes, a file, a background process, a
	// checkpoint, a saved template, a secret, a schedule, a webhook, a run.
	sbA, err := a.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatalf("A create: %v", err)
	}
	defer sbA.Delete(context.WithoutCancel(ctx))
	sbA2, err := a.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatalf("A create: %v", err)
	}
	defer sbA2.Delete(context.WithoutCancel(ctx))
	if err := sbA.WriteFile(ctx, "/root/data.txt", []byte("tenant A's data\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	proc, err := sbA.Start(ctx, api.ExecRequest{Cmd: []string{"sleep", "3600"}})
	if err != nil {
		t.Fatal(err)
	}
	ck, err := sbA.Checkpoint(ctx, "before")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sbA.SaveTemplate(ctx, "tpl-a"); err != nil {
		t.Fatal(err)
	}
	const secretA = "tenant-a-secret-value-0123456789"
	if _, err := a.SetSecret(ctx, "tok", []byte(secretA)); err != nil {
		t.Fatal(err)
	}
	sch, err := a.CreateSchedule(ctx, agentbox.CreateScheduleRequest{Cron: "0 0 1 1 *", RunAction: api.RunAction{Template: "busybox", Command: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	hook, err := a.CreateHook(ctx, api.RunAction{Template: "busybox", Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sbA.Run(ctx, "echo hello"); err != nil {
		t.Fatal(err)
	}
	runs, err := a.Runs(ctx, agentbox.RunQuery{Sandbox: sbA.ID()})
	if err != nil || len(runs) == 0 {
		t.Fatalf("A's runs: %v %v", runs, err)
	}
	exp, err := sbA.Expose(ctx, 8080, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	objA := tenantObjects{
		sandbox: sbA.ID(), sandbox2: sbA2.ID(), checkpoint: ck.ID, template: "tpl-a", secret: "tok",
		schedule: sch.ID, hook: hook.ID, run: runs[0].ID, tenant: "tenant-a", key: keyA.ID, pid: proc.Pid(),
		exposure: exp.ID,
	}
	// Ids of the same shapes that name nothing.
	unknown := tenantObjects{
		sandbox: "zz" + randHex(5)[:10], sandbox2: "zy" + randHex(5)[:10], checkpoint: "zx" + randHex(5)[:10], template: "tpl-none",
		secret: "none", schedule: "sch_" + randHex(8), hook: "hook_" + randHex(8), run: "run_" + randHex(10),
		tenant: "tenant-none", key: "zzzzzzzzzzzzzzzz", pid: proc.Pid(), exposure: "zzzzzzzz" + randHex(4),
	}
	// B owns a sandbox too, to aim cross-tenant body ids from.
	sbB, err := b.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatalf("B create: %v", err)
	}
	defer sbB.Delete(context.WithoutCancel(ctx))
	before := snapshotTenant(t, d, objA)

	var spec struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(api.OpenAPI, &spec); err != nil {
		t.Fatal(err)
	}
	type route struct{ method, path string }
	var routes []route
	for path, ops := range spec.Paths {
		for _, m := range []string{"get", "put", "post", "patch", "delete"} {
			if _, ok := ops[m]; ok && (strings.Contains(path, "{") || queryRoutes[strings.ToUpper(m)+" "+path]) {
				routes = append(routes, route{strings.ToUpper(m), path}) // lists and creates: checked below
			}
		}
	}
	// Sorted, with B's PUT of a secret named like A's last: it creates
	// B's own secret of that name (names are per tenant), which B could
	// then delete.
	slices.SortFunc(routes, func(x, y route) int {
		lastX, lastY := x.method+" "+x.path == "PUT /v1/secrets/{name}", y.method+" "+y.path == "PUT /v1/secrets/{name}"
		if lastX != lastY {
			if lastX {
				return 1
			}
			return -1
		}
		return strings.Compare(x.path+" "+x.method, y.path+" "+y.method)
	})
	tested := 0
	for _, rt := range routes {
		method, path := rt.method, rt.path
		target, body := fillRoute(method, path, objA, sbB.ID())
		utarget, ubody := fillRoute(method, path, unknown, sbB.ID())
		st, _, got := rawCall(t, base, keyB.Key, method, target, body)
		ust, _, ugot := rawCall(t, base, keyB.Key, method, utarget, ubody)
		tested++
		want := http.StatusNotFound
		switch {
		case adminOnlyRoutes[method+" "+path]:
			want = http.StatusForbidden
		case method == "POST" && path == "/v1/hooks/{sid}":
			want = http.StatusUnauthorized // delivery: signature, not key
		case method == "PUT" && path == "/v1/secrets/{name}":
			want = http.StatusOK // B's own secret of that name
		}
		if st != want || ust != want {
			t.Errorf("%s %s with B's key: %d (A's ids) / %d (unknown ids), want %d\n%s\n%s", method, path, st, ust, want, got, ugot)
			continue
		}
		if want == http.StatusOK {
			continue
		}
		if g, u := normalizeError(got, objA), normalizeError(ugot, unknown); g != u {
			t.Errorf("%s %s: A's ids answer differently from unknown ids:\n  A's:     %s\n  unknown: %s", method, path, g, u)
		}
	}
	if tested < 50 {
		t.Fatalf("only %d routes replayed; is the OpenAPI document complete?", tested)
	}
	t.Logf("replayed %d routes with tenant B's key", tested)

	// Lists show B nothing of A's.
	for _, target := range []string{"/v1/sandboxes", "/v1/checkpoints", "/v1/templates", "/v1/secrets", "/v1/schedules", "/v1/hooks", "/v1/runs", "/v1/usage", "/v1/usage/export", "/v1/keys", "/v1/tenants/tenant-b", "/v1/exposures", "/v1/audit/verify"} {
		st, _, body := rawCall(t, base, keyB.Key, "GET", target, nil)
		if st != 200 {
			t.Errorf("GET %s as B: %d %s", target, st, body)
			continue
		}
		for _, id := range []string{objA.sandbox, objA.sandbox2, objA.checkpoint, objA.template, objA.schedule, objA.hook, objA.run, objA.key, objA.exposure, "tenant-a"} {
			if bytes.Contains(body, []byte(id)) {
				t.Errorf("GET %s as B shows A's %s: %s", target, id, body)
			}
		}
	}
	// The daemon's info shows B its own sandboxes and no host path.
	if st, _, body := rawCall(t, base, keyB.Key, "GET", "/v1/info", nil); st != 200 {
		t.Errorf("GET /v1/info as B: %d %s", st, body)
	} else {
		var info api.Info
		if err := json.Unmarshal(body, &info); err != nil || info.DataDir != "" || info.Sandboxes != 1 {
			t.Errorf("GET /v1/info as B: data dir %q, %d sandboxes (B has 1): %s", info.DataDir, info.Sandboxes, body)
		}
	}
	// Creating from A's template or secret as B finds nothing.
	if _, err := b.Create(ctx, agentbox.SandboxSpec{Template: "tpl-a"}); !agentbox.IsNotFound(err) {
		t.Errorf("B creating from A's template: %v, want not found", err)
	}
	if res, err := sbB.Run(ctx, "echo $TOK", agentbox.WithSecret("tok", "TOK")); err == nil && strings.Contains(string(res.Stdout), secretA) {
		t.Errorf("B's exec got A's secret")
	}

	after := snapshotTenant(t, d, objA)
	if before != after {
		t.Errorf("tenant A's objects changed while B replayed the API:\nbefore: %s\nafter:  %s", before, after)
	}
	// A's secret still holds A's value (B's PUT made B's own).
	sum := sha256.Sum256([]byte(secretA))
	if out := strings.TrimSpace(mustRun(t, sbA, "printf %s \"$TOK\" | sha256sum | cut -d' ' -f1", agentbox.WithSecret("tok", "TOK"))); out != hex.EncodeToString(sum[:]) {
		t.Errorf("A's secret changed: sha256 %s", out)
	}
	// A's key still works.
	if _, err := a.Get(ctx, sbA.ID()); err != nil {
		t.Errorf("A's own sandbox through A's key: %v", err)
	}
}

// queryRoutes are routes without path parameters that name objects in
// their query; they are replayed like routes with ids.
var queryRoutes = map[string]bool{"GET /v1/diff": true, "GET /v1/exposures": true}

// adminOnlyRoutes answer 403 to every tenant, whatever the ids.
var adminOnlyRoutes = map[string]bool{
	"PATCH /v1/tenants/{tenant}":    true,
	"DELETE /v1/tenants/{tenant}":   true,
	"PUT /v1/templates/{name}/pool": true,
}

// fillRoute puts o's ids into a route of the OpenAPI document and gives a
// request body that passes validation, so the request reaches the point
// where the object is looked up. own is a sandbox of the caller (B), used
// where one id of the request is the caller's and the other is o's.
func fillRoute(method, path string, o tenantObjects, own string) (string, []byte) {
	target := path
	name := o.template
	if strings.HasPrefix(path, "/v1/secrets/") {
		name = o.secret
	}
	sid := o.schedule
	if strings.HasPrefix(path, "/v1/hooks/") {
		sid = o.hook
	}
	for k, v := range map[string]string{
		"{id}": o.sandbox, "{cid}": o.checkpoint, "{pid}": strconv.Itoa(o.pid), "{name}": name,
		"{sid}": sid, "{run}": o.run, "{tenant}": o.tenant, "{key}": o.key, "{exposure}": o.exposure,
		"{ctx}": "ctx-" + o.sandbox,
	} {
		target = strings.ReplaceAll(target, k, v)
	}
	var body []byte
	switch method + " " + path {
	case "GET /v1/diff":
		target += "?from=sandbox:" + own + "&to=checkpoint:" + o.checkpoint
	case "GET /v1/sandboxes/{id}/files", "DELETE /v1/sandboxes/{id}/fs", "GET /v1/sandboxes/{id}/fs/stat",
		"GET /v1/sandboxes/{id}/fs/list", "GET /v1/sandboxes/{id}/fs/archive", "PUT /v1/sandboxes/{id}/fs/archive",
		"GET /v1/sandboxes/{id}/fs/watch":
		target += "?path=/root"
	case "PUT /v1/sandboxes/{id}/files":
		target += "?path=/root/x"
		body = []byte("x")
	case "POST /v1/sandboxes/{id}/exec":
		body = []byte(`{"cmd":["true"]}`)
	case "POST /v1/sandboxes/{id}/processes/{pid}/stdin":
		body = []byte("x")
	case "POST /v1/sandboxes/{id}/processes/{pid}/signal":
		body = []byte(`{"signal":"KILL"}`)
	case "POST /v1/sandboxes/{id}/processes/{pid}/resize":
		body = []byte(`{"rows":24,"cols":80}`)
	case "POST /v1/sandboxes/{id}/fs/mkdir":
		body = []byte(`{"path":"/root/d"}`)
	case "POST /v1/sandboxes/{id}/fs/move":
		body = []byte(`{"from":"/root/data.txt","to":"/root/moved.txt"}`)
	case "POST /v1/sandboxes/{id}/restore":
		body = []byte(`{"checkpoint":"` + o.checkpoint + `"}`)
	case "POST /v1/sandboxes/{id}/merge":
		body = []byte(`{"from":"` + o.sandbox2 + `"}`)
	case "POST /v1/sandboxes/{id}/template":
		body = []byte(`{"name":"stolen"}`)
	case "PUT /v1/sandboxes/{id}/network":
		body = []byte(`{"mode":"none"}`)
	case "POST /v1/sandboxes/{id}/upgrade", "POST /v1/sandboxes/{id}/checkpoints", "POST /v1/sandboxes/{id}/fork",
		"POST /v1/checkpoints/{cid}/fork", "POST /v1/schedules/{sid}/trigger":
		body = []byte(`{}`)
	case "PUT /v1/secrets/{name}":
		body = []byte("b's own value")
	case "PATCH /v1/tenants/{tenant}":
		body = []byte(`{"quotas":{"max_sandboxes":1}}`)
	case "POST /v1/sandboxes/{id}/exposures":
		body = []byte(`{"port":8080}`)
	case "GET /v1/sandboxes/{id}/artifacts/file":
		target += "?path=/root/data.txt"
	case "GET /v1/sandboxes/{id}/artifacts/diff":
		target += "?from=checkpoint:" + o.checkpoint
	case "GET /v1/sandboxes/{id}/artifacts/report":
		target += "?run=" + o.run
	case "POST /v1/sandboxes/{id}/replay":
		body = []byte(`{"checkpoint":"` + o.checkpoint + `"}`)
	case "POST /v1/sandboxes/{id}/code":
		body = []byte(`{"code":"1"}`)
	case "POST /v1/sandboxes/{id}/code/contexts":
		body = []byte(`{"language":"python"}`)
	case "GET /v1/exposures":
		target += "?sandbox=" + o.sandbox
	case "PUT /v1/templates/{name}/pool":
		body = []byte(`{"size":1}`)
	case "POST /v1/hooks/{sid}":
		body = []byte(`{}`)
	}
	return target, body
}

var (
	requestIDRe = regexp.MustCompile(`"request_id":"[^"]*"`)
)

// normalizeError returns an error body with o's ids replaced by
// placeholders, for comparing answers about different ids.
func normalizeError(body []byte, o tenantObjects) string {
	s := requestIDRe.ReplaceAllString(string(body), `"request_id":""`)
	for _, r := range []struct{ id, ph string }{
		{o.sandbox2, "<SANDBOX2>"}, {o.sandbox, "<SANDBOX>"}, {o.checkpoint, "<CHECKPOINT>"}, {o.schedule, "<SCHEDULE>"},
		{o.hook, "<HOOK>"}, {o.run, "<RUN>"}, {o.tenant, "<TENANT>"}, {o.key, "<KEY>"}, {o.template, "<TEMPLATE>"},
		{`secret ` + o.secret + `:`, "secret <SECRET>:"}, {`exposure ` + o.exposure + `:`, "exposure <EXPOSURE>:"},
	} {
		s = strings.ReplaceAll(s, r.id, r.ph)
	}
	return strings.TrimSpace(s)
}

// snapshotTenant describes A's objects as the admin sees them: anything
// a cross-tenant request could have changed.
func snapshotTenant(t *testing.T, d *daemon, o tenantObjects) string {
	t.Helper()
	ctx := context.Background()
	var parts []string
	add := func(format string, args ...any) { parts = append(parts, fmt.Sprintf(format, args...)) }
	for _, id := range []string{o.sandbox, o.sandbox2} {
		sb, err := d.client.Get(ctx, id)
		if err != nil {
			t.Fatalf("admin get %s: %v", id, err)
		}
		tr, _ := sb.Transitions(ctx)
		info := sb.Info()
		add("%s state=%s tenant=%s net=%v transitions=%d", id, info.State, info.Tenant, info.Network, len(tr))
		cks, _ := sb.Checkpoints(ctx)
		add("%s checkpoints=%d", id, len(cks))
		procs, _ := sb.Processes(ctx)
		var live []string
		for _, p := range procs {
			if p.Running {
				live = append(live, strconv.Itoa(p.Pid))
			}
		}
		add("%s running=%v", id, live)
		out := mustRun(t, sb, "ls -la /root | sort; cat /root/data.txt 2>/dev/null; true")
		add("%s files=%q", id, out)
	}
	all, err := d.client.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sb := range all {
		if sb.Info().Tenant == "tenant-a" {
			n++
		}
	}
	add("tenant-a sandboxes=%d", n)
	st, body := d.rawRequest(t, "GET", "/v1/checkpoints/"+o.checkpoint, nil)
	add("checkpoint %d %s", st, body)
	st, body = d.rawRequest(t, "GET", "/v1/schedules/"+o.schedule, nil)
	add("schedule %d %s", st, body)
	st, body = d.rawRequest(t, "GET", "/v1/hooks/"+o.hook, nil)
	add("hook %d %s", st, body)
	st, body = d.rawRequest(t, "GET", "/v1/templates/tenant-a~"+o.template+"/versions", nil)
	add("template %d %s", st, body)
	st, body = d.rawRequest(t, "GET", "/v1/exposures?sandbox="+o.sandbox, nil)
	add("exposures %d %s", st, body)
	st, body = d.rawRequest(t, "GET", "/v1/keys", nil)
	add("keys %d", st)
	var keys api.APIKeyList
	_ = json.Unmarshal(body, &keys)
	for _, k := range keys.Keys {
		add("key %s tenant=%s revoked=%v", k.ID, k.Tenant, k.RevokedAt != nil)
	}
	st, body = d.rawRequest(t, "GET", "/v1/tenants/tenant-a", nil)
	var tn api.Tenant
	_ = json.Unmarshal(body, &tn)
	add("tenant %d quotas=%+v", st, tn.Quotas)
	st, body = d.rawRequest(t, "GET", "/v1/secrets", nil)
	add("secrets %d", st)
	var secs api.SecretList
	_ = json.Unmarshal(body, &secs)
	for _, s := range secs.Secrets {
		if s.Tenant == "tenant-a" {
			add("secret %s updated=%s", s.Name, s.UpdatedAt)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, "\n")
}

// Revoking a key ends an exec stream open with it within seconds, and the
// key is refused from then on.
func TestTenantRevokedKeyEndsExecStream(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	c, key := tenantClient(t, d, base, "tenant-r", api.Quotas{}, api.ScopeFull)
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.client.Sandbox(sb.ID()).Delete(context.WithoutCancel(ctx))
	started := make(chan struct{})
	done := make(chan error, 1)
	out := &signalWriter{first: started}
	go func() {
		_, err := sb.Exec(ctx, api.ExecRequest{Command: "echo up; sleep 600"}, agentbox.Streams{Stdout: out})
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the exec stream never started")
	}
	start := time.Now()
	if err := d.client.RevokeAPIKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the stream ended as if the command had finished")
		}
		t.Logf("stream ended %v after the revocation: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(5 * time.Second):
		t.Fatal("the exec stream is still open 5s after its key was revoked")
	}
	if _, err := c.List(ctx, nil); !agentbox.IsUnauthenticated(err) {
		t.Fatalf("list with the revoked key: %v, want unauthenticated", err)
	}
	keys, err := d.client.APIKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.ID == key.ID && k.RevokedAt == nil {
			t.Fatal("the key is not listed as revoked")
		}
	}
}

// Read-only keys read and never write.
func TestTenantReadOnlyKey(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	full, _ := tenantClient(t, d, base, "tenant-ro", api.Quotas{}, api.ScopeFull)
	ro, _ := tenantClient(t, d, base, "tenant-ro", api.Quotas{}, api.ScopeRead)
	sb, err := full.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	if err := sb.WriteFile(ctx, "/root/f", []byte("v"), 0o644); err != nil {
		t.Fatal(err)
	}
	rsb, err := ro.Get(ctx, sb.ID())
	if err != nil {
		t.Fatalf("read key get: %v", err)
	}
	if b, err := rsb.ReadFile(ctx, "/root/f"); err != nil || string(b) != "v" {
		t.Fatalf("read key read file: %q %v", b, err)
	}
	if _, err := rsb.Run(ctx, "true"); !agentbox.IsPermissionDenied(err) {
		t.Errorf("read key exec: %v, want permission denied", err)
	}
	if err := rsb.WriteFile(ctx, "/root/f", []byte("w"), 0o644); !agentbox.IsPermissionDenied(err) {
		t.Errorf("read key write: %v, want permission denied", err)
	}
	if err := rsb.Delete(ctx); !agentbox.IsPermissionDenied(err) {
		t.Errorf("read key delete: %v, want permission denied", err)
	}
	if _, err := ro.CreateAPIKey(ctx, api.CreateAPIKeyRequest{}); !agentbox.IsPermissionDenied(err) {
		t.Errorf("read key minting a key: %v, want permission denied", err)
	}
}

// Over a quota, creates and execs get 429 with Retry-After.
func TestTenantQuotas(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()

	t.Run("Sandboxes", func(t *testing.T) {
		c, key := tenantClient(t, d, base, "tenant-q1", api.Quotas{MaxSandboxes: 2}, api.ScopeFull)
		for i := 0; i < 2; i++ {
			sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
			if err != nil {
				t.Fatalf("create %d within quota: %v", i, err)
			}
			defer sb.Delete(context.WithoutCancel(ctx))
		}
		st, retry, body := rawCall(t, base, key.Key, "POST", "/v1/sandboxes", []byte(`{"template":"busybox"}`))
		if st != http.StatusTooManyRequests || retry == "" {
			t.Fatalf("third create: %d Retry-After %q %s", st, retry, body)
		}
		if n, err := strconv.Atoi(retry); err != nil || n <= 0 {
			t.Fatalf("Retry-After %q", retry)
		}
		// Forks count too.
		sbs, _ := c.List(ctx, nil)
		if _, err := sbs[0].Fork(ctx, 1); !agentbox.IsResourceExhausted(err) {
			t.Fatalf("fork over quota: %v", err)
		}
	})

	t.Run("Disk", func(t *testing.T) {
		c, _ := tenantClient(t, d, base, "tenant-q2", api.Quotas{DiskBytes: 96 << 20}, api.ScopeFull)
		if _, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox", Resources: api.Resources{DiskBytes: 128 << 20}}); !agentbox.IsResourceExhausted(err) {
			t.Fatalf("create asking more disk than the quota: %v", err)
		}
		sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
		if err != nil {
			t.Fatalf("create within the disk quota: %v", err)
		}
		defer sb.Delete(context.WithoutCancel(ctx))
		if got := sb.Info().Resources.DiskBytes; got != 96<<20 {
			t.Fatalf("a sandbox of a tenant with a disk quota got disk limit %d, want what is left (%d)", got, 96<<20)
		}
		if _, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"}); !agentbox.IsResourceExhausted(err) {
			t.Fatalf("create with the disk quota spent: %v", err)
		}
		// The limit is real: writing past it fails inside.
		res := run(t, sb, "dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1; echo rc=$?")
		if !strings.Contains(string(res.Stdout), "No space left") {
			t.Fatalf("filling past the quota: %s", res.Stdout)
		}
	})

	t.Run("CPU", func(t *testing.T) {
		c, key := tenantClient(t, d, base, "tenant-q3", api.Quotas{CPUSeconds: 0.2, PeriodSeconds: 3600}, api.ScopeFull)
		sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Delete(context.WithoutCancel(ctx))
		// Burn CPU for 3 s in one run (metered as it goes and when it
		// ends); even at the default CPU limit that is well over 0.2 s.
		mustRun(t, sb, "end=$(($(date +%s)+3)); while [ $(date +%s) -lt $end ]; do :; done")
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, retry, body := rawCall(t, base, key.Key, "POST", "/v1/sandboxes/"+sb.ID()+"/exec", []byte(`{"cmd":["true"]}`))
			if st == http.StatusTooManyRequests {
				n, err := strconv.Atoi(retry)
				if err != nil || n <= 0 || n > 3600 {
					t.Fatalf("Retry-After %q", retry)
				}
				t.Logf("exec over the CPU quota: 429, Retry-After %ss", retry)
				break
			}
			if time.Now().After(deadline) {
				tn, _ := d.client.Tenant(ctx, "tenant-q3")
				t.Fatalf("exec after spending the CPU quota: %d %s (usage %+v)", st, body, tn.Usage)
			}
			time.Sleep(300 * time.Millisecond)
		}
		if _, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"}); !agentbox.IsResourceExhausted(err) {
			t.Fatalf("create over the CPU quota: %v", err)
		}
		tn, err := d.client.Tenant(ctx, "tenant-q3")
		if err != nil || tn.Usage == nil || tn.Usage.CPUSeconds < 0.2 {
			t.Fatalf("tenant usage: %+v %v", tn.Usage, err)
		}
	})
}

// signalWriter closes first on its first write.
type signalWriter struct {
	mu    sync.Mutex
	first chan struct{}
	wrote bool
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.wrote {
		w.wrote = true
		close(w.first)
	}
	return len(p), nil
}
