package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/egress"
)

// Egress benchmarks, measured through the real path: a client program
// (bench/egressclient) inside a sandbox in egress mode → the guest's
// listener on 127.0.0.1:3128 → the yamux reverse tunnel over the guest
// socket → the daemon's egress proxy → a loopback upstream on the host.
// The baseline is the same client on the host, straight to the upstream.

const (
	keyEgressDirect    = "egress-direct"
	keyEgressTunnelled = "egress-tunnelled"
	keyEgressIntercept = "egress-intercepted"
	keyEgressStream    = "egress-connect-64m"
	groupEgress        = "egress"

	egressStreamBytes = 64 << 20
	egressSecret      = "bench-secret-value"
)

func init() {
	groupOrder = append(groupOrder, groupEgress)
	groupTitles[groupEgress] = "Egress proxy (client inside a sandbox, upstream on host loopback)"
}

// egressTargets are the absolute targets for the egress rows.
func egressTargets(results []result) []ratioLine {
	thr := ratioLine{ratio: ratio{Label: "egress CONNECT tunnel throughput, median (MB/s)", Target: 500}}
	if r, ok := measuredByKey(results)[keyEgressStream]; ok {
		thr.Value = float64(egressStreamBytes) / 1e6 / r.Median.Seconds()
		thr.Status = status(thr.Value >= thr.Target)
	} else {
		thr.Status = "not measured"
	}
	return []ratioLine{
		addedLatency(results, ratio{Label: "egress added latency p50, intercepted − direct (ms)", Num: keyEgressIntercept, Den: keyEgressDirect, Target: 1, Max: true}),
		addedLatency(results, ratio{Label: "egress added latency p50, tunnelled − direct (ms)", Num: keyEgressTunnelled, Den: keyEgressDirect}),
		thr,
	}
}

func status(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}

// egressFixture is what the egress measurements run against.
type egressFixture struct {
	dir        string
	client     string // egressclient binary on the host
	upCAFile   string
	apiPort    int // HTTPS upstream on 127.0.0.2
	sinkPort   int // byte sink on 127.0.0.2
	closeUp    func()
	daemon     *daemon
	sandboxID  string
	restoreEnv func()
}

// measureEgress starts a private daemon whose egress proxy resolves the
// benchmark's names to loopback upstreams, and measures a small HTTPS GET
// direct, tunnelled and intercepted, and 64 MiB through a CONNECT tunnel.
func measureEgress(ctx context.Context, b *bench, root, bin, template string, buildTimeout time.Duration) []result {
	const (
		directName    = "egress: small HTTPS GET, host client straight to the upstream (keep-alive)"
		tunnelledName = "egress: same GET from inside, CONNECT tunnel through the proxy (keep-alive)"
		interceptName = "egress: same GET from inside, intercepted with credential injection (keep-alive)"
		streamName    = "egress: 64 MiB from inside through a fresh CONNECT tunnel"
	)
	skipAll := func(why string) []result {
		return []result{
			skipped(keyEgressDirect, groupEgress, directName, why),
			skipped(keyEgressTunnelled, groupEgress, tunnelledName, why),
			skipped(keyEgressIntercept, groupEgress, interceptName, why),
			skipped(keyEgressStream, groupEgress, streamName, why),
		}
	}
	f, err := setupEgressFixture(ctx, root, bin, template, buildTimeout)
	if err != nil {
		return skipAll(err.Error())
	}
	defer f.close()
	note := "bench/egressclient, net/http with HTTPS_PROXY and SSL_CERT_FILE; medians of per-request times measured by the client"
	apiURL := "https://api.bench.test:" + strconv.Itoa(f.apiPort) + "/"
	tun := "https://tunnel.bench.test:" + strconv.Itoa(f.apiPort) + "/"
	n, w := strconv.Itoa(b.n), strconv.Itoa(max(b.warmup, 3))

	var out collector
	// Direct: the same client on the host, dialling the upstream itself.
	cmd := exec.CommandContext(ctx, f.client, "latency", apiURL, n, w)
	cmd.Env = []string{"SSL_CERT_FILE=" + f.upCAFile, "EGRESSCLIENT_DIAL=127.0.0.2:" + strconv.Itoa(f.apiPort)}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	o, err := cmd.Output()
	out.add(samplesResult(keyEgressDirect, directName, "host process, "+note, o, err, stderr.String()))
	o, err = f.execOut(ctx, "egressclient", "latency", tun, n, w)
	out.add(samplesResult(keyEgressTunnelled, tunnelledName, note+"; the tunnelled destination presents its own certificate", o, err, ""))
	o, err = f.execOut(ctx, "egressclient", "latency", apiURL, n, w)
	out.add(samplesResult(keyEgressIntercept, interceptName, note+"; TLS terminated with the sandbox CA, Authorization injected, response scrubbed", o, err, ""))
	o, err = f.execOut(ctx, "egressclient", "throughput", "sink.bench.test:"+strconv.Itoa(f.sinkPort), strconv.Itoa(egressStreamBytes), n, w)
	out.add(samplesResult(keyEgressStream, streamName, "CONNECT, write 64 MiB in 256 KiB writes, half-close, wait for the sink's 1-byte ack; the sandbox has 1 CPU", o, err, ""))
	return out
}

// samplesResult turns the client's output (one duration in ns per line)
// into a result.
func samplesResult(key, name, note string, out []byte, err error, stderr string) result {
	if err != nil {
		return skipped(key, groupEgress, name, strings.TrimSpace(err.Error()+" "+stderr))
	}
	var samples []time.Duration
	for _, l := range strings.Fields(string(out)) {
		ns, perr := strconv.ParseInt(l, 10, 64)
		if perr != nil {
			return skipped(key, groupEgress, name, "bad client output: "+l)
		}
		samples = append(samples, time.Duration(ns))
	}
	if len(samples) == 0 {
		return skipped(key, groupEgress, name, "no samples")
	}
	return result{Key: key, Group: groupEgress, Name: name, Note: note, Summary: summarize(samples)}
}

func setupEgressFixture(ctx context.Context, root, bin, template string, buildTimeout time.Duration) (*egressFixture, error) {
	f := &egressFixture{}
	ok := false
	defer func() {
		if !ok {
			f.close()
		}
	}()
	var err error
	if f.dir, err = os.MkdirTemp("", "agentbox-bench-egress-"); err != nil {
		return nil, err
	}
	f.client = filepath.Join(f.dir, "egressclient")
	if err := goBuild(ctx, root, "./bench/egressclient", f.client); err != nil {
		return nil, err
	}

	// Upstreams: HTTPS with a certificate of a private CA, and a sink.
	ca, err := egress.LoadOrCreateCA(f.dir, "agentbox bench upstream CA")
	if err != nil {
		return nil, err
	}
	f.upCAFile = filepath.Join(f.dir, "upstream-ca.pem")
	if err := os.WriteFile(f.upCAFile, ca.CertPEM(), 0o644); err != nil {
		return nil, err
	}
	up, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }),
		TLSConfig: &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) }},
	}
	go func() { _ = srv.ServeTLS(up, "", "") }()
	sink, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		srv.Close()
		return nil, err
	}
	go serveSink(sink)
	f.closeUp = func() { srv.Close(); sink.Close() }
	f.apiPort, f.sinkPort = up.Addr().(*net.TCPAddr).Port, sink.Addr().(*net.TCPAddr).Port

	// The daemon reads its egress configuration from the environment.
	hosts := filepath.Join(f.dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.2 api.bench.test tunnel.bench.test sink.bench.test\n"), 0o644); err != nil {
		return nil, err
	}
	env := map[string]string{
		"AGENTBOX_EGRESS_HOSTS_FILE": hosts,
		"AGENTBOX_EGRESS_CA_FILE":    f.upCAFile,
		"AGENTBOX_EGRESS_PERMIT":     "127.0.0.2/32",
		"AGENTBOX_SECRETS_KEY_FILE":  filepath.Join(f.dir, "secrets.key"),
	}
	for k, v := range env {
		os.Setenv(k, v)
	}
	f.restoreEnv = func() {
		for k := range env {
			os.Unsetenv(k)
		}
	}
	if f.daemon, err = startDaemon(ctx, bin, ""); err != nil {
		return nil, err
	}
	if err := f.daemon.buildTemplateWithin(ctx, template, buildTimeout); err != nil {
		return nil, err
	}
	if err := f.daemon.raw(ctx, http.MethodPut, "/v1/secrets/bench", []byte(egressSecret), http.StatusOK); err != nil {
		return nil, err
	}
	p := strconv.Itoa(f.apiPort)
	resp, err := f.daemon.do(ctx, http.MethodPost, "/v1/sandboxes", api.CreateSandboxRequest{
		Template: template,
		Labels:   map[string]string{benchLabel: "1"},
		Network: &api.NetworkSpec{
			Mode:        api.NetworkEgress,
			Allow:       []string{"tunnel.bench.test:" + p, "sink.bench.test:" + strconv.Itoa(f.sinkPort)},
			Credentials: []api.CredentialRule{{Secret: "bench", Host: "api.bench.test", Port: f.apiPort}},
		},
	})
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if resp.StatusCode != http.StatusCreated {
		err = statusError(resp)
		resp.Body.Close()
		return nil, err
	}
	err = json.NewDecoder(resp.Body).Decode(&sb)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	f.sandboxID = sb.ID
	if err := f.daemon.install(ctx, sb.ID, f.client, "/usr/local/bin/egressclient"); err != nil {
		return nil, err
	}
	// The upstream's CA stands in for a public root in the image's trust
	// store (tunnelled destinations present their own certificate).
	bundle, err := f.execOut(ctx, "cat", "/etc/ssl/agentbox-bundle.pem")
	if err != nil {
		return nil, err
	}
	bundle = append(append(bundle, '\n'), ca.CertPEM()...)
	if err := f.daemon.raw(ctx, http.MethodPut, "/v1/sandboxes/"+sb.ID+"/files?mode=0644&path="+url.QueryEscape("/etc/ssl/agentbox-bundle.pem"), bundle, http.StatusOK); err != nil {
		return nil, err
	}
	ok = true
	return f, nil
}

// serveSink reads each connection to its end, then answers one byte.
func serveSink(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			if _, err := io.Copy(io.Discard, c); err == nil {
				_, _ = c.Write([]byte{'k'})
			}
		}()
	}
}

func (f *egressFixture) close() {
	if f.daemon != nil {
		if f.sandboxID != "" {
			_ = f.daemon.remove(context.Background(), f.sandboxID)
		}
		f.daemon.stop()
	}
	if f.restoreEnv != nil {
		f.restoreEnv()
	}
	if f.closeUp != nil {
		f.closeUp()
	}
	if f.dir != "" {
		_ = os.RemoveAll(f.dir)
	}
}

// execOut runs argv in the fixture's sandbox and returns its stdout; a
// non-zero exit is an error carrying stderr.
func (f *egressFixture) execOut(ctx context.Context, argv ...string) ([]byte, error) {
	resp, err := f.daemon.do(ctx, http.MethodPost, "/v1/sandboxes/"+f.sandboxID+"/exec", api.ExecRequest{Cmd: argv})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp)
	}
	var stdout, stderr []byte
	dec := json.NewDecoder(resp.Body)
	for {
		var ev api.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			return nil, fmt.Errorf("exec %v: %w", argv, err)
		}
		switch ev.Type {
		case api.EventStdout:
			stdout = append(stdout, ev.Data...)
		case api.EventStderr:
			stderr = append(stderr, ev.Data...)
		case api.EventExit:
			if ev.ExitCode == nil || *ev.ExitCode != 0 {
				return nil, fmt.Errorf("exec %v: exit %+v: %s", argv, ev, bytes.TrimSpace(stderr))
			}
			return stdout, nil
		case api.EventError:
			return nil, fmt.Errorf("exec %v: error event %+v", argv, ev.Error)
		}
	}
}

// raw sends body as application/octet-stream and checks the status.
func (d *daemon) raw(ctx context.Context, method, path string, body []byte, want int) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://agentbox"+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set(api.VersionHeader, api.Version)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	return drain(resp, want)
}

const egressMethodText = `
### Egress

- A private ` + "`agentbox serve`" + ` whose egress proxy resolves ` + "`*.bench.test`" + ` to
  upstreams on 127.0.0.2 (a hosts file) and trusts their private CA; one
  busybox sandbox in egress mode with a credential rule for ` + "`api.bench.test`" + `.
- The client is ` + "`bench/egressclient`" + ` (static Go, ` + "`net/http`" + ` with
  ` + "`HTTPS_PROXY`" + ` and ` + "`SSL_CERT_FILE`" + `), uploaded into the sandbox and run by one
  exec per measurement; it times each request itself, so exec overhead is not
  included. The path measured is the real one: client → guest listener on
  127.0.0.1:3128 → yamux tunnel over the guest socket → host proxy → upstream.
- Direct = the same client on the host connecting straight to the upstream.
  Added latency = median(inside) − median(direct), both over keep-alive
  connections (the first requests, with the handshakes, are warm-up).
- Throughput: per run a fresh CONNECT to a sink on 127.0.0.2, 64 MiB
  written, half-close, and the sink's one-byte acknowledgement; MB/s =
  64 MiB / median.
`
