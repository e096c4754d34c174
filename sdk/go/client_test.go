package agentbox_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
	"github.com/agentbox/agentbox/sdk/go/agentboxtest"
)

func newClient(t *testing.T, host string, opts ...agentbox.Option) *agentbox.Client {
	t.Helper()
	c, err := agentbox.New(append([]agentbox.Option{agentbox.WithHost(host)}, opts...)...)
	if err != nil {
		t.Fatalf("New(%s): %v", host, err)
	}
	return c
}

// TestNoInternalImports keeps the SDK (and its fake daemon) usable outside
// this module: nothing it builds with may live under internal/.
func TestNoInternalImports(t *testing.T) {
	goBin := testutil.RequiresBinary(t, "go")
	for _, pkg := range []string{".", "./agentboxtest"} {
		out, err := exec.Command(goBin, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed only %v", pkg, deps)
		}
		for _, d := range deps {
			if strings.Contains(d, "/internal/") && strings.HasPrefix(d, "github.com/") {
				t.Errorf("%s depends on %s", pkg, d)
			}
		}
	}
}

func TestUnixSocketTransport(t *testing.T) {
	srv := agentboxtest.NewUnixServer(t, filepath.Join(t.TempDir(), "agentbox.sock"))
	c := newClient(t, srv.Host)
	ctx := context.Background()
	if err := c.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.Version != "fake-1.0" || info.API != api.Version {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Labels: map[string]string{"a": "1"}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if sb.ID() == "" || sb.Info().State != api.StateRunning || sb.Info().Template != "busybox" {
		t.Fatalf("created %+v", sb.Info())
	}
	reqs := srv.Requests()
	if got := reqs[len(reqs)-1].Header.Get(api.VersionHeader); got != api.Version {
		t.Errorf("%s header = %q, want %q", api.VersionHeader, got, api.Version)
	}
	if got := reqs[len(reqs)-1].Header.Get("Authorization"); got != "" {
		t.Errorf("Authorization sent without a key: %q", got)
	}
}

func TestNewFromEnv(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	srv.APIKey = "s3cret"
	t.Setenv(agentbox.EnvHost, srv.Host)
	t.Setenv(agentbox.EnvAPIKey, "s3cret")
	c, err := agentbox.NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if c.Host() != srv.Host {
		t.Fatalf("Host() = %q, want %q", c.Host(), srv.Host)
	}
	if err := c.Health(context.Background()); err != nil {
		t.Fatalf("Health with key from env: %v", err)
	}
	t.Setenv(agentbox.EnvHost, "")
	c, err = agentbox.NewFromEnv()
	if err != nil || c.Host() != agentbox.DefaultHost {
		t.Fatalf("NewFromEnv with no host = %v, %v; want %s", c.Host(), err, agentbox.DefaultHost)
	}
	if _, err := agentbox.New(agentbox.WithHost("ftp://x")); err == nil {
		t.Fatal("New accepted an ftp:// host")
	}
}

func TestAPIKey(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	srv.APIKey = "k1"
	ctx := context.Background()

	_, err := newClient(t, srv.Host).List(ctx, nil)
	if !agentbox.IsUnauthenticated(err) {
		t.Fatalf("List without key: err = %v, want unauthenticated", err)
	}
	_, err = newClient(t, srv.Host, agentbox.WithAPIKey("wrong")).List(ctx, nil)
	if !agentbox.IsUnauthenticated(err) {
		t.Fatalf("List with wrong key: err = %v, want unauthenticated", err)
	}
	if _, err := newClient(t, srv.Host, agentbox.WithAPIKey("k1")).List(ctx, nil); err != nil {
		t.Fatalf("List with key: %v", err)
	}
	reqs := srv.Requests()
	if got := reqs[len(reqs)-1].Header.Get("Authorization"); got != "Bearer k1" {
		t.Fatalf("Authorization = %q", got)
	}
}

func TestErrorDecoding(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	c := newClient(t, srv.Host)
	_, err := c.Get(context.Background(), "sb-missing")
	var apiErr *agentbox.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("Get missing: %T %v, want *APIError", err, err)
	}
	if apiErr.Status != http.StatusNotFound || apiErr.Code != agentbox.CodeNotFound ||
		!strings.HasPrefix(apiErr.RequestID, "req-") || !strings.Contains(apiErr.Message, "sb-missing") {
		t.Fatalf("APIError = %+v", apiErr)
	}
	if !agentbox.IsNotFound(err) || agentbox.IsConflict(err) || agentbox.RequestID(err) != apiErr.RequestID {
		t.Fatalf("category helpers disagree on %v", err)
	}
	if !strings.Contains(err.Error(), "getting sandbox sb-missing") {
		t.Errorf("error lacks context: %q", err)
	}

	// A body that is not an api.Error still yields a typed error.
	plain := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.RequestIDHeader, "rid-7")
		http.Error(w, "busy", http.StatusServiceUnavailable)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go plain.Serve(ln)
	t.Cleanup(func() { plain.Close() })
	err = newClient(t, "http://"+ln.Addr().String()).Health(context.Background())
	if !errors.As(err, &apiErr) || apiErr.Status != 503 || !agentbox.IsUnavailable(err) || apiErr.RequestID != "rid-7" || apiErr.Message != "busy" {
		t.Fatalf("plain-text error = %#v (%v)", apiErr, err)
	}
}

func TestUnreachable(t *testing.T) {
	ctx := context.Background()
	err := newClient(t, "unix://"+filepath.Join(t.TempDir(), "none.sock")).Health(ctx)
	if !agentbox.IsUnreachable(err) {
		t.Fatalf("missing socket: IsUnreachable(%v) = false", err)
	}
	var ce *agentbox.ConnectionError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "none.sock") {
		t.Fatalf("missing socket: %v, want a ConnectionError naming the socket", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := newClient(t, "http://"+addr).Health(ctx); !agentbox.IsUnreachable(err) {
		t.Fatalf("closed port: IsUnreachable(%v) = false", err)
	}

	srv := agentboxtest.NewServer(t)
	_, err = newClient(t, srv.Host).Get(ctx, "nope")
	if agentbox.IsUnreachable(err) {
		t.Fatalf("a daemon's 404 reported as unreachable")
	}
}

func TestListAndDelete(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	c := newClient(t, srv.Host)
	ctx := context.Background()
	a, err := c.Create(ctx, agentbox.SandboxSpec{Labels: map[string]string{"team": "x", "env": "ci"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, agentbox.SandboxSpec{Labels: map[string]string{"team": "y"}}); err != nil {
		t.Fatal(err)
	}
	all, err := c.List(ctx, nil)
	if err != nil || len(all) != 2 {
		t.Fatalf("List() = %d sandboxes, %v", len(all), err)
	}
	got, err := c.List(ctx, map[string]string{"team": "x", "env": "ci"})
	if err != nil || len(got) != 1 || got[0].ID() != a.ID() {
		t.Fatalf("List(team=x,env=ci) = %v, %v", got, err)
	}
	if q := srv.Requests()[len(srv.Requests())-1].Query; q != "label=env%3Dci&label=team%3Dx" {
		t.Errorf("label query = %q", q)
	}
	if err := a.Delete(ctx); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := a.Refresh(ctx); !agentbox.IsNotFound(err) {
		t.Fatalf("Refresh after delete: %v, want not found", err)
	}
	if _, err := c.Create(ctx, agentbox.SandboxSpec{Template: "nope"}); !agentbox.IsNotFound(err) {
		t.Fatalf("Create from a missing template: %v", err)
	}
}

func TestTemplates(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	c := newClient(t, srv.Host)
	ctx := context.Background()
	ts, err := c.Templates(ctx)
	if err != nil || len(ts) < 1 || ts[0].Name != "busybox" {
		t.Fatalf("Templates = %+v, %v", ts, err)
	}
	var events []api.BuildEvent
	spec := &api.TemplateSpec{Name: "py", Base: "debootstrap:bookworm", Steps: []api.TemplateStep{{Run: "apt-get install python3"}, {Run: "true"}}}
	tpl, err := c.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: spec}, func(ev api.BuildEvent) { events = append(events, ev) })
	if err != nil || tpl.Name != "py" || !tpl.Built {
		t.Fatalf("BuildTemplate = %+v, %v", tpl, err)
	}
	if len(events) != 6 || events[0].Step != 1 || events[0].Steps != 3 || events[5].Type != api.BuildEventDone {
		t.Fatalf("events = %+v", events)
	}
	if got, err := c.Template(ctx, "py"); err != nil || got.ID != tpl.ID {
		t.Fatalf("Template(py) = %+v, %v", got, err)
	}
	spec.Steps = append(spec.Steps, api.TemplateStep{Run: "fail"})
	_, err = c.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: spec}, nil)
	var apiErr *agentbox.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != agentbox.CodeFailedPrecondition || apiErr.RequestID == "" {
		t.Fatalf("failing build: %v", err)
	}
}

// The SDK adds its context to an error unless the daemon's message already
// starts with it: a message never says "exec in sandbox X" twice. The
// reason of an error is kept.
func TestErrorContextOnce(t *testing.T) {
	srv := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"code":"not_found","message":"exec in sandbox sb-1: guest exec: executable \"x\" not found in PATH: not found","request_id":"r1","reason":"command_not_found"}`))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := newClient(t, "http://"+ln.Addr().String())
	_, err = c.Sandbox("sb-1").Run(context.Background(), "x")
	var apiErr *agentbox.APIError
	if !errors.As(err, &apiErr) || apiErr.Reason != agentbox.ReasonCommandNotFound || strings.Count(err.Error(), "exec in sandbox") != 1 {
		t.Fatalf("Run = %v (%+v), want the daemon's message once, with its reason", err, apiErr)
	}
	// Context the daemon's message lacks is added.
	_, err = c.Get(context.Background(), "sb-1")
	if !strings.HasPrefix(err.Error(), "getting sandbox sb-1: exec in sandbox") {
		t.Fatalf("Get = %v, want the SDK's context first", err)
	}
}
