package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"

	"github.com/agentbox/agentbox/api"
)

// BenchmarkRequestIntercepted is a small HTTPS GET through the proxy with
// TLS interception and credential injection (keep-alive on both legs);
// compare with BenchmarkRequestDirect for the added latency.
func BenchmarkRequestIntercepted(b *testing.B) {
	e := newEnv(b, defaultSpec)
	c := e.client(false)
	benchGet(b, c, "https://api.good.test:"+strconv.Itoa(e.port)+"/")
}

// BenchmarkRequestDirect is the same request straight to the upstream.
func BenchmarkRequestDirect(b *testing.B) {
	e := newEnv(b, defaultSpec)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.upRoots, ServerName: "api.good.test"}}
	benchGet(b, &http.Client{Transport: tr}, "https://127.0.0.2:"+strconv.Itoa(e.port)+"/")
}

func benchGet(b *testing.B, c *http.Client, u string) {
	b.Helper()
	get := func() {
		resp, err := c.Get(u)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	get() // warm the connections
	b.ResetTimer()
	for b.Loop() {
		get()
	}
}

// BenchmarkConnectThroughput streams bytes through a CONNECT tunnel (no
// interception) to a loopback sink.
func BenchmarkConnectThroughput(b *testing.B) {
	sink, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	port := sink.Addr().(*net.TCPAddr).Port
	e := newEnv(b, func(*env) (s api.NetworkSpec) {
		s.Mode = "egress"
		s.Allow = []string{"tunnel.good.test:" + strconv.Itoa(port)}
		return s
	})
	c, err := net.Dial("tcp", e.proxyURL.Host)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	dest := "tunnel.good.test:" + strconv.Itoa(port)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("CONNECT: %v %v", err, resp)
	}
	buf := make([]byte, 256<<10)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkForbidden is the internal-address check each resolved and each
// dialled address passes.
func BenchmarkForbidden(b *testing.B) {
	p := New(Config{Permit: []*Rule{mustPermit(b, "127.0.0.2/32")}, SelfPorts: []int{8080}, Logger: testLogger()})
	addr := netip.MustParseAddr("93.184.216.34")
	for b.Loop() {
		if p.forbidden(addr, 443) != "" {
			b.Fatal("forbidden")
		}
	}
}
