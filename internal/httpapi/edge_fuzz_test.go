package httpapi

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

// FuzzHostAllowed checks the Host policy on arbitrary Host headers: with no
// allow list exactly IP literals and localhost pass (with or without a
// port), "*" passes everything, and an explicit list never lets through a
// host that is not on it.
func FuzzHostAllowed(f *testing.F) {
	for _, s := range []string{"127.0.0.1:8080", "[::1]:1", "localhost", "LOCALHOST:9", "evil.example", "evil.example:80", "10.0.0.1", "[fe80::1%eth0]:1", "", ":", "[", "127.0.0.1.evil.example", "localhost.", "0x7f.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, hostport string) {
		host := hostport
		if h, _, err := net.SplitHostPort(hostport); err == nil {
			host = h
		}
		host = strings.Trim(host, "[]")
		_, ipErr := netip.ParseAddr(host)
		want := ipErr == nil || strings.EqualFold(host, "localhost")
		if got := hostAllowed(hostport, nil); got != want {
			t.Fatalf("default policy: hostAllowed(%q) = %v, want %v", hostport, got, want)
		}
		if !hostAllowed(hostport, []string{"*"}) {
			t.Fatalf("hostAllowed(%q, *) = false", hostport)
		}
		if hostAllowed(hostport, []string{"api.example.com"}) && !strings.EqualFold(host, "api.example.com") {
			t.Fatalf("hostAllowed(%q, [api.example.com]) = true", hostport)
		}
	})
}
