package test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// tcpprobe is a static client uploaded into sandboxes: it connects to
// host:port directly (no proxy), sends a request line and prints what
// happened, telling a refused connection from one accepted and closed.
const tcpprobeSrc = `package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

func main() {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(os.Args[1], os.Args[2]), 2*time.Second)
	if errors.Is(err, syscall.ECONNREFUSED) {
		fmt.Println("REFUSED")
		os.Exit(1)
	}
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", os.Args[1])
	b, _ := io.ReadAll(io.LimitReader(c, 4096))
	fmt.Printf("CONNECTED %q\n", b)
}
`

// buildStatic compiles a one-file Go program for uploading into sandboxes.
func buildStatic(t *testing.T, dir, name, src string) []byte {
	t.Helper()
	file := filepath.Join(dir, name+".go")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, file)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hostAddr returns a non-loopback IPv4 address of the host, or "".
func hostAddr() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	return ""
}

// TestEgressIsolationFromInside attacks the network edge from inside a
// sandbox in egress mode: ICMP to the host and out, the host's loopback
// services, and another sandbox's listener (directly and through the
// proxy under a policy that allows every name and address tried) all
// fail, while an allowed destination keeps working. Switching egress off
// closes the proxy port (refused, not accepted and dropped); switching it
// back on reopens it.
func TestEgressIsolationFromInside(t *testing.T) { egressIsolationFromInside(t, "native") }

// TestEgressIsolationFromInsideGvisor: the same on the gvisor backend,
// where the sandbox's network is the sentry's own (runsc --network=none:
// a loopback and nothing else) and the proxy port is the guest's, as
// under native.
func TestEgressIsolationFromInsideGvisor(t *testing.T) {
	requiresRunsc(t)
	egressIsolationFromInside(t, "gvisor")
}

func egressIsolationFromInside(t *testing.T, rt string) {
	dir := t.TempDir()
	up := startUpstreams(t, dir)
	probe := buildStatic(t, dir, "tcpprobe", tcpprobeSrc)
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// A host service on the host's loopback and on its outside address.
	hostMarker := "host-service-" + randHex(4)
	hostSrv := func(addr string) string {
		ln, err := net.Listen("tcp", addr+":0")
		if err != nil {
			t.Fatal(err)
		}
		s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(hostMarker)) })}
		go func() { _ = s.Serve(ln) }()
		t.Cleanup(func() { s.Close() })
		return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	hostLoopPort := hostSrv("127.0.0.1")
	outside := hostAddr()
	var outsidePort string
	if outside != "" {
		outsidePort = hostSrv(outside)
	}

	// Sandbox B serves a marker on its own loopback.
	b := d.create(t, agentbox.SandboxSpec{Runtime: rt})
	bMarker := "sandbox-b-" + randHex(4)
	const bPort = "18080"
	mustRun(t, b, "mkdir -p /tmp/www && echo "+bMarker+" > /tmp/www/index.html")
	if _, err := b.Start(ctx, api.ExecRequest{Command: "httpd -f -p 127.0.0.1:" + bPort + " -h /tmp/www"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, func() bool { return run(t, b, "wget -q -O - http://127.0.0.1:"+bPort+"/").ExitCode == 0 })
	if out := mustRun(t, b, "wget -q -O - http://127.0.0.1:"+bPort+"/"); !strings.Contains(out, bMarker) {
		t.Fatalf("B cannot reach its own listener: %q", out)
	}

	// Sandbox A may use the proxy for the good upstream and, to show the
	// proxy is not the way to B either, for every name of B on B's port.
	// Rules naming loopback (by address or as localhost) are refused: the
	// daemon permits only 127.0.0.2.
	hp := strconv.Itoa(up.httpPort)
	for _, rule := range []string{"127.0.0.1:" + bPort, "localhost:" + bPort, "localhost:" + hostLoopPort} {
		_, err := d.client.Create(ctx, agentbox.SandboxSpec{Runtime: rt, Network: &api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{"good.test:" + hp, rule}}})
		if !agentbox.IsInvalidArgument(err) {
			t.Fatalf("create allowing %s: %v, want invalid argument", rule, err)
		}
	}
	a := d.create(t, agentbox.SandboxSpec{Runtime: rt, Network: &api.NetworkSpec{
		Mode:  api.NetworkEgress,
		Allow: []string{"good.test:" + hp, b.ID() + ":" + bPort},
	}})
	if err := a.WriteFile(ctx, "/usr/local/bin/tcpprobe", probe, 0o755); err != nil {
		t.Fatal(err)
	}
	allowed := func() {
		t.Helper()
		if out := mustRun(t, a, "wget -q -O - http://good.test:"+hp+"/plain"); !strings.Contains(out, "hello from good.test") {
			t.Fatalf("allowed destination: %q", out)
		}
	}
	allowed()

	// ICMP. The sandbox's own loopback answers (ping works at all), the
	// host and the outside do not.
	pingOwn := run(t, a, "ping -c1 -W1 127.0.0.1")
	t.Logf("ping of the sandbox's own loopback: exit %d %s%s", pingOwn.ExitCode, pingOwn.Stdout, pingOwn.Stderr)
	icmp := []string{"ping -c1 -W1 192.0.2.1", "ping -c1 -W1 8.8.8.8", "ping -c1 -W1 169.254.169.254"}
	if outside != "" {
		icmp = append(icmp, "ping -c1 -W1 "+outside)
	}
	for _, cmd := range icmp {
		if res := run(t, a, cmd); res.ExitCode == 0 || bytes.Contains(res.Stdout, []byte("1 packets received")) {
			t.Errorf("%q from inside: exit %d: %s %s", cmd, res.ExitCode, res.Stdout, res.Stderr)
		}
	}

	// Direct TCP to the host's services and to B: nothing answers with
	// their markers. (127.0.0.1 inside is the sandbox's own loopback.)
	direct := []string{"tcpprobe 127.0.0.1 " + hostLoopPort, "tcpprobe 127.0.0.1 " + bPort}
	if outside != "" {
		direct = append(direct, "tcpprobe "+outside+" "+outsidePort)
	}
	for _, cmd := range direct {
		res := run(t, a, cmd)
		if res.ExitCode == 0 || bytes.Contains(res.Stdout, []byte(hostMarker)) || bytes.Contains(res.Stdout, []byte(bMarker)) {
			t.Errorf("%q from inside: exit %d: %s %s", cmd, res.ExitCode, res.Stdout, res.Stderr)
		}
	}

	// Through the proxy, by every name and address: never B, never the
	// host's loopback service.
	for _, u := range []string{
		"http://127.0.0.1:" + bPort + "/", "http://localhost:" + bPort + "/", "http://" + b.ID() + ":" + bPort + "/",
		"http://localhost:" + hostLoopPort + "/",
	} {
		res := run(t, a, "wget -q -O - "+u)
		if res.ExitCode == 0 || bytes.Contains(res.Stdout, []byte(bMarker)) || bytes.Contains(res.Stdout, []byte(hostMarker)) {
			t.Errorf("%s through the proxy: exit %d: %s", u, res.ExitCode, res.Stdout)
		}
	}
	allowed()

	// Egress off: the proxy port refuses connections; on again: it works.
	if out := mustRun(t, a, "tcpprobe 127.0.0.1 3128; true"); !strings.HasPrefix(out, "CONNECTED") {
		t.Fatalf("proxy port in egress mode: %q", out)
	}
	if err := a.SetNetwork(ctx, api.NetworkSpec{Mode: api.NetworkNone}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, func() bool { return strings.TrimSpace(mustRun(t, a, "tcpprobe 127.0.0.1 3128; true")) == "REFUSED" })
	// Stays closed (no listener comes back behind our back).
	time.Sleep(time.Second)
	if out := mustRun(t, a, "tcpprobe 127.0.0.1 3128; true"); strings.TrimSpace(out) != "REFUSED" {
		t.Fatalf("proxy port after egress was switched off: %q", out)
	}
	if res := run(t, a, "wget -q -O - http://good.test:"+hp+"/plain"); res.ExitCode == 0 {
		t.Fatalf("mode none still reaches out: %s", res.Stdout)
	}
	if err := a.SetNetwork(ctx, api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{"good.test:" + hp}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, func() bool { return run(t, a, "wget -q -O - http://good.test:"+hp+"/plain").ExitCode == 0 })
}

// TestSecretsNotInCheckpointsOrHostFiles gives a sandbox's runs a stored
// secret three ways (per-command secret, injected credential, run token),
// then takes a checkpoint while a process holding the secret is alive and
// scans the checkpoint's layer, every file under the daemon's directory
// (data dir, log) and the sandbox's filesystem for the value, raw and
// encoded. A marker written inside before the checkpoint is the positive
// control: the scan must find it in the checkpoint's layer. The egress
// records of the token run carry its run id.
func TestSecretsNotInCheckpointsOrHostFiles(t *testing.T) {
	secretsNotInCheckpointsOrHostFiles(t, "native")
}

// TestSecretsNotInCheckpointsOrHostFilesGvisor: the same on the gvisor
// backend, whose bundles, runsc state and logs are under the daemon's
// directory too and so scanned with it.
func TestSecretsNotInCheckpointsOrHostFilesGvisor(t *testing.T) {
	requiresRunsc(t)
	secretsNotInCheckpointsOrHostFiles(t, "gvisor")
}

func secretsNotInCheckpointsOrHostFiles(t *testing.T, rt string) {
	dir := t.TempDir()
	up := startUpstreams(t, dir)
	bin := buildStatic(t, dir, "httpsget", httpsgetSrc)
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	value := "ghp_" + randHex(12) + "_CKPT"
	if code, body := d.rawRequest(t, "PUT", "/v1/secrets/gh", []byte(value)); code != 200 {
		t.Fatalf("storing secret: %d %s", code, body)
	}
	tp, hp := strconv.Itoa(up.tlsPort), strconv.Itoa(up.httpPort)
	sb := d.create(t, agentbox.SandboxSpec{Runtime: rt, Network: &api.NetworkSpec{
		Mode:        api.NetworkEgress,
		Allow:       []string{"good.test:" + hp},
		Credentials: []api.CredentialRule{{Secret: "gh", Host: "api.good.test", Port: up.tlsPort}},
	}})
	if err := sb.WriteFile(ctx, "/usr/local/bin/httpsget", bin, 0o755); err != nil {
		t.Fatal(err)
	}

	// An injected request made by a token run: the upstream gets the real
	// header, the record names the run.
	up.mu.Lock()
	up.auth = nil
	up.mu.Unlock()
	out := mustRun(t, sb, `echo "TOKEN $AGENTBOX_RUN_TOKEN"; httpsget https://api.good.test:`+tp+`/repos`, agentbox.WithRunToken())
	up.mu.Lock()
	got := append([]string(nil), up.auth...)
	up.mu.Unlock()
	if len(got) != 1 || got[0] != "Bearer "+value {
		t.Fatalf("upstream saw Authorization %q", got)
	}
	if strings.Contains(out, value) || !strings.Contains(out, "STATUS 200") {
		t.Fatalf("response inside: %q", out)
	}
	runID := tokenRunID(t, out)
	// A per-command secret, used and copied around in memory only.
	mustRun(t, sb, `test -n "$GH" && x=$(printf %s "$GH" | base64) && test -n "$x"`, agentbox.WithSecret("gh", "GH"))
	holder, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 120", Secrets: []api.ExecSecret{{Name: "gh", Env: "GH"}}})
	if err != nil {
		t.Fatal(err)
	}
	// A plain request while the holder runs beside a token run: not
	// attributable, so no run id.
	mustRun(t, sb, "wget -q -O - http://good.test:"+hp+"/beside", agentbox.WithRunToken())

	recs, err := sb.EgressLog(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var injected, beside bool
	for _, r := range recs {
		if r.Kind == "request" && r.Path == "/repos" {
			injected = true
			if r.RunID != runID {
				t.Errorf("injected request record has run %q, want %q", r.RunID, runID)
			}
		}
		if r.Path == "/beside" {
			beside = true
			if r.RunID != "" {
				t.Errorf("request beside another process attributed to run %q", r.RunID)
			}
		}
	}
	if !injected || !beside {
		raw, _ := json.Marshal(recs)
		t.Fatalf("records lack the requests: %s", raw)
	}

	// Positive control, then the checkpoint (the holder is alive and frozen
	// while it is taken).
	marker := "ckpt-marker-" + randHex(6)
	mustRun(t, sb, "echo "+marker+" > /root/marker")
	cp, err := sb.Checkpoint(ctx, "after secrets")
	if err != nil {
		t.Fatal(err)
	}
	if len(cp.Layers) == 0 {
		t.Fatalf("checkpoint without layers: %+v", cp)
	}
	_ = holder.Signal(ctx, "KILL")

	needles := map[string][]byte{
		"raw":    []byte(value),
		"base64": []byte(base64.StdEncoding.EncodeToString([]byte(value))),
		"marker": []byte(marker),
	}
	scan := func(root string) map[string][]string {
		found := map[string][]string{}
		_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil
			}
			for k := range fileHolds(p, needles) {
				found[k] = append(found[k], p)
			}
			return nil
		})
		return found
	}
	layerDir := checkpointLayerDir(t, d, cp.Layers[0])
	if f := scan(layerDir); len(f["marker"]) == 0 || len(f["raw"])+len(f["base64"]) > 0 {
		t.Fatalf("checkpoint layer %s: found %v (want the marker only)", layerDir, f)
	}
	if rt == "gvisor" {
		memoryImageHoldsNoSecret(t, d, sb, cp.ID, needles)
	}
	// Everything the daemon keeps: data dir (store, layers, checkpoints,
	// sandbox state, encrypted secrets, memory images) and its log.
	if f := scan(d.dir); len(f["raw"])+len(f["base64"]) > 0 {
		t.Fatalf("secret found on the host: %v", f)
	}
	// A sandbox restored from the checkpoint has no trace of it either.
	if _, err := sb.Restore(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	// (The value is sent rot13'd: not even a command line inside holds it.)
	if out := mustRun(t, sb, `cat /root/marker; v=$(echo `+rot13(value)+` | `+rot13Cmd+`); find / -xdev -type f -exec grep -lF "$v" {} + 2>/dev/null; true`); strings.TrimSpace(out) != marker {
		t.Fatalf("restored sandbox: %q", out)
	}
}

// tokenRunID reads the run id (jti) out of the "TOKEN <jwt>" line of out.
func tokenRunID(t *testing.T, out string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		tok, ok := strings.CutPrefix(l, "TOKEN ")
		if !ok {
			continue
		}
		parts := strings.Split(strings.TrimSpace(tok), ".")
		if len(parts) != 3 {
			t.Fatalf("not a JWT: %q", tok)
		}
		payload, err := base64.RawURLEncoding.DecodeString(parts[1])
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			ID string `json:"jti"`
		}
		if err := json.Unmarshal(payload, &c); err != nil || c.ID == "" {
			t.Fatalf("token claims %s: %v", payload, err)
		}
		return c.ID
	}
	t.Fatalf("no token in %q", out)
	return ""
}

// checkpointLayerDir finds the directory of layer id in the daemon's layer
// store (named by a prefix of the id).
func checkpointLayerDir(t *testing.T, d *daemon, id string) string {
	t.Helper()
	root := filepath.Join(d.dataDir, "layers")
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() && len(e.Name()) >= 8 && strings.HasPrefix(id, e.Name()) {
			return filepath.Join(root, e.Name())
		}
	}
	t.Fatalf("layer %s not found under %s", id, root)
	return ""
}

// memoryImageHoldsNoSecret is the gvisor backend's part of
// secretsNotInCheckpointsOrHostFiles: a memory checkpoint holds the memory
// of every process of the sandbox, the guest's among them, which handled
// the secret for every run given it. So one is refused even once no
// process started with the secret runs any more; a restore from the
// filesystem checkpoint cp starts a fresh guest, after which it is taken
// and its image holds no trace of the secret. A process holding a marker
// in memory is the positive control: the scan must find it in the image
// (which runsc writes uncompressed).
func memoryImageHoldsNoSecret(t *testing.T, d *daemon, sb *agentbox.Sandbox, cp string, needles map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	memMarker := "mem-marker-" + randHex(6)
	_, err := sb.CheckpointWith(ctx, agentbox.CheckpointOptions{Name: "memory after secrets", Memory: true})
	if !agentbox.IsFailedPrecondition(err) {
		t.Fatalf("memory checkpoint of a sandbox whose guest handled the secret: %v; want failed_precondition", err)
	}
	if _, err := sb.Restore(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 600; echo " + memMarker}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.CheckpointWith(ctx, agentbox.CheckpointOptions{Name: "memory after a restore", Memory: true}); err != nil {
		t.Fatalf("memory checkpoint with a fresh guest: %v", err)
	}
	mem := map[string][]byte{"memory marker": []byte(memMarker)}
	for k, v := range needles {
		mem[k] = v
	}
	found := map[string][]string{}
	_ = filepath.WalkDir(filepath.Join(d.dataDir, "memory"), func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			for k := range fileHolds(p, mem) {
				found[k] = append(found[k], p)
			}
		}
		return nil
	})
	if len(found["memory marker"]) == 0 {
		t.Fatalf("the memory image holds not even the marker of a running process: %v", found)
	}
	if len(found["raw"])+len(found["base64"]) > 0 {
		t.Errorf("the secret is in the memory image: %v", found)
	}
}
