package e2b

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// hostRouter is a HostRouter for {port}-{id}.sb.test that records what
// reached ServeOtherPort.
type hostRouter struct {
	host  string
	admit error
}

func (h *hostRouter) ParseHost(host string) (string, int, bool, error) {
	label, ok := strings.CutSuffix(host, ".sb.test")
	if !ok {
		return "", 0, false, nil
	}
	p, id, ok := strings.Cut(label, "-")
	n, err := strconv.Atoi(p)
	if !ok || err != nil || p != strconv.Itoa(n) {
		return "", 0, true, fmt.Errorf("bad host: %w", errdefs.ErrInvalidArgument)
	}
	return id, n, true, nil
}

func (h *hostRouter) ServeOtherPort(w http.ResponseWriter, r *http.Request, admit func(tenant.Principal) error) error {
	h.host = r.Host
	if h.admit = admit(tenant.Principal{Tenant: "a", Scope: api.ScopeFull}); h.admit != nil {
		return h.admit
	}
	if r.Header.Get("X-Service-Token") != "ok" {
		return fmt.Errorf("no service token: %w", errdefs.ErrNotFound)
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// hostRequest sends a request addressed by host, with headers hdr.
func hostRequest(t *testing.T, base, host, path string, hdr map[string]string) int {
	t.Helper()
	req, err := http.NewRequest("GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// With a HostRouter, {port}-{id}.{domain} addresses envd and the code
// interpreter with the same tokens as the headers do (and the headers
// cannot redirect such a request), any other port goes to the router
// (service URLs), and other hosts are the control plane.
func TestHostRouting(t *testing.T) {
	ci := &portRecorder{}
	hr := &hostRouter{}
	_, _, srv := testServerWith(t, Config{Ports: map[int]PortHandler{CodeInterpreterPort: ci}, Hosts: hr, Domain: "sb.test"})
	a := create(t, srv, "key-a", `{}`)
	b := create(t, srv, "key-a", `{}`)
	if a.Domain == nil || *a.Domain != "sb.test" {
		t.Errorf("domain in create: %v", a.Domain)
	}
	envdHost := "49983-" + a.SandboxID + ".sb.test"
	tok := map[string]string{headerAccessToken: a.EnvdAccessToken}
	if st := hostRequest(t, srv.URL, envdHost, "/health", tok); st != 204 {
		t.Errorf("envd by host with the token: %d", st)
	}
	if st := hostRequest(t, srv.URL, envdHost, "/health", nil); st != 401 {
		t.Errorf("envd by host without a token: %d", st)
	}
	if st := hostRequest(t, srv.URL, "49983-"+b.SandboxID+".sb.test", "/health", tok); st != 401 {
		t.Errorf("another sandbox's host with a's token: %d", st)
	}
	// Headers naming another sandbox do not override the host.
	hdr := map[string]string{headerAccessToken: a.EnvdAccessToken, headerSandboxID: b.SandboxID, headerSandboxPort: "49999"}
	if st := hostRequest(t, srv.URL, envdHost, "/health", hdr); st != 204 {
		t.Errorf("envd by host with headers of another sandbox: %d", st)
	}
	if st := hostRequest(t, srv.URL, "49999-"+a.SandboxID+".sb.test", "/contexts", map[string]string{headerTrafficToken: a.TrafficAccessToken}); st != http.StatusTeapot || ci.id != a.SandboxID || ci.owner != "a" {
		t.Errorf("code interpreter by host: %d %+v", st, ci)
	}
	if st := hostRequest(t, srv.URL, "049983-"+a.SandboxID+".sb.test", "/health", tok); st != 400 {
		t.Errorf("non-canonical port in the host: %d", st)
	}
	// Other ports are service URLs: the E2B tokens do not open them.
	other := "8080-" + a.SandboxID + ".sb.test"
	if st := hostRequest(t, srv.URL, other, "/", tok); st != 404 || hr.host != other || hr.admit != nil {
		t.Errorf("another port with the envd token: %d %+v", st, hr)
	}
	if st := hostRequest(t, srv.URL, other, "/", map[string]string{"X-Service-Token": "ok"}); st != http.StatusAccepted {
		t.Errorf("another port with its service token: %d", st)
	}
	// Any other host is the control plane.
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+a.SandboxID, nil)
	req.Host = "api.example.test"
	req.Header.Set(headerAPIKey, "key-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("control plane on another host: %v %v", resp, err)
	}
	resp.Body.Close()
}
