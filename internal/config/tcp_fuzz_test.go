package config

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

// FuzzLoopbackAddr: loopbackAddr accepts only host:port whose host is
// "localhost" or parses as a loopback IP; anything else (every interface,
// names, garbage) needs TLS or --insecure-tcp.
func FuzzLoopbackAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1:1", "[::1]:1", "localhost:1", ":1", "0.0.0.0:1", "[::]:1", "[::ffff:127.0.0.1]:1", "example.com:1", "127.0.0.1", "127.0.0.1.nip.io:1", "[::1%lo]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, hostport string) {
		if !loopbackAddr(hostport) {
			return
		}
		host, _, err := net.SplitHostPort(hostport)
		if err != nil {
			t.Fatalf("%q accepted without a port", hostport)
		}
		if strings.EqualFold(host, "localhost") {
			return
		}
		if ip, err := netip.ParseAddr(host); err == nil && ip.Unmap().IsLoopback() {
			return
		}
		t.Fatalf("%q accepted as loopback", hostport)
	})
}
