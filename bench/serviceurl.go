package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Service URL benchmarks: a small GET to a server inside a sandbox
// (test/testdata/svcecho), made by a client inside the same sandbox
// straight to 127.0.0.1, and by a client on the host through the daemon's
// TCP listener and service proxy (token check, guest dial, splice). The
// difference of the medians is what the proxy adds.

const (
	keyServiceInside = "service-inside"
	keyServiceProxy  = "service-proxied"
	groupService     = "service"
	servicePort      = 8080
)

func init() {
	groupOrder = append(groupOrder, groupService)
	groupTitles[groupService] = "Service URLs (server inside a sandbox)"
}

// serviceTargets is the target for the proxy: ≤ 1 ms added p50.
func serviceTargets(results []result) []ratioLine {
	return []ratioLine{addedLatency(results, ratio{Label: "service URL proxy added latency p50, proxied − inside (ms)", Num: keyServiceProxy, Den: keyServiceInside, Target: 1, Max: true})}
}

func measureServiceURL(ctx context.Context, b *bench, root, bin, template string, buildTimeout time.Duration) []result {
	const (
		insideName = "service: small GET from inside the sandbox to 127.0.0.1 (keep-alive)"
		proxyName  = "service: same GET from the host through the service URL proxy (keep-alive)"
	)
	skipAll := func(why string) []result {
		return []result{skipped(keyServiceInside, groupService, insideName, why), skipped(keyServiceProxy, groupService, proxyName, why)}
	}
	dir, err := os.MkdirTemp("", "agentbox-bench-svc-")
	if err != nil {
		return skipAll(err.Error())
	}
	defer os.RemoveAll(dir)
	helper := filepath.Join(dir, "svcecho")
	if err := goBuild(ctx, root, "./test/testdata/svcecho", helper); err != nil {
		return skipAll(err.Error())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return skipAll(err.Error())
	}
	addr := ln.Addr().String()
	ln.Close()
	// The daemon reads its listener from the environment; service
	// requests need no API key (the token is the credential).
	os.Setenv("AGENTBOX_TCP", addr)
	os.Setenv("AGENTBOX_SECRETS_KEY_FILE", filepath.Join(dir, "secrets.key"))
	d, err := startDaemon(ctx, bin, "")
	os.Unsetenv("AGENTBOX_TCP")
	os.Unsetenv("AGENTBOX_SECRETS_KEY_FILE")
	if err != nil {
		return skipAll(err.Error())
	}
	defer d.stop()
	if err := d.buildTemplateWithin(ctx, template, buildTimeout); err != nil {
		return skipAll(err.Error())
	}
	id, err := d.create(ctx, template)
	if err != nil {
		return skipAll(err.Error())
	}
	f := &egressFixture{daemon: d, sandboxID: id} // for execOut
	if err := d.install(ctx, id, helper, "/usr/local/bin/svcecho"); err != nil {
		return skipAll(err.Error())
	}
	resp, err := d.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/exec", api.ExecRequest{Cmd: []string{"svcecho", "serve", strconv.Itoa(servicePort)}, Background: true})
	if err != nil {
		return skipAll(err.Error())
	}
	if err := drain(resp, http.StatusCreated); err != nil {
		return skipAll("starting svcecho: " + err.Error())
	}
	inside := "http://127.0.0.1:" + strconv.Itoa(servicePort) + "/hello"
	for i := 0; ; i++ {
		if _, err := f.execOut(ctx, "svcecho", "bench", inside, "1"); err == nil {
			break
		} else if i > 100 {
			return skipAll("svcecho did not start: " + err.Error())
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err = d.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/exposures", api.ExposeRequest{Port: servicePort})
	if err != nil {
		return skipAll(err.Error())
	}
	var x api.Exposure
	err = json.NewDecoder(resp.Body).Decode(&x)
	resp.Body.Close()
	if err != nil || x.Token == "" {
		return skipAll(fmt.Sprintf("expose: %v (status %d)", err, resp.StatusCode))
	}
	note := "test/testdata/svcecho serving an 18-byte body; per-request times measured by the client, first requests (connection set-up) are warm-up"
	var out collector
	w := max(b.warmup, 3)
	o, err := f.execOut(ctx, "svcecho", "bench", inside, strconv.Itoa(b.n+w))
	out.add(samplesResult(keyServiceInside, insideName, "client inside the sandbox, one exec; "+note, dropLines(o, w), err, ""))
	samples, err := timeGets(ctx, "http://"+addr+x.Path+"hello", x.Token, b.n+w)
	var buf bytes.Buffer
	for _, s := range samples[min(w, len(samples)):] {
		fmt.Fprintln(&buf, s.Nanoseconds())
	}
	out.add(samplesResult(keyServiceProxy, proxyName, "host client, path-based URL on the TCP listener, X-Agentbox-Token; "+note, buf.Bytes(), err, ""))
	for i := range out {
		out[i].Group = groupService
	}
	return out
}

// dropLines drops the first n lines of out (warm-up samples).
func dropLines(out []byte, n int) []byte {
	for ; n > 0; n-- {
		i := bytes.IndexByte(out, '\n')
		if i < 0 {
			return nil
		}
		out = out[i+1:]
	}
	return out
}

// timeGets makes n GETs of u with the token on one keep-alive connection
// and returns each round trip.
func timeGets(ctx context.Context, u, token string, n int) ([]time.Duration, error) {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	var out []time.Duration
	for range n {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set(api.ServiceTokenHeader, token)
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

const serviceMethodText = `
### Service URLs

- A private ` + "`agentbox serve --tcp 127.0.0.1:PORT`" + `, one busybox sandbox running
  ` + "`test/testdata/svcecho serve 8080`" + ` (static Go ` + "`net/http`" + `; ` + "`/hello`" + ` answers 18
  bytes), exposed with ` + "`POST /v1/sandboxes/{id}/exposures`" + `.
- Inside = ` + "`svcecho bench`" + ` run in the sandbox by one exec, GETs to
  127.0.0.1:8080 on one keep-alive connection, each timed by the client.
- Proxied = the same GETs from the host to
  ` + "`/v1/sandboxes/{id}/ports/8080/hello`" + ` on the daemon's TCP listener with the
  token header, one keep-alive connection: request id and log line, token
  check, acquire of the sandbox (wake, activity), and the service proxy's
  pooled connection through the guest (guest dial operation, spliced unix
  socket).
- Added latency = median(proxied) − median(inside); target ≤ 1 ms.
`
