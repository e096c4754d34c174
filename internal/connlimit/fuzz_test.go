package connlimit

import (
	"net"
	"net/netip"
	"testing"
)

// FuzzClientKey: the address a connection is counted by is its IPv4
// address, or the /64 of its IPv6 address; an unparsable address maps to
// the zero Addr (one shared bucket) and never panics.
func FuzzClientKey(f *testing.F) {
	for _, s := range []string{"127.0.0.1:1", "[::1]:2", "[2001:db8::1]:3", "[::ffff:1.2.3.4]:4", "[fe80::1%eth0]:5", "garbage", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k := clientKey(strAddr(s))
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			if k.IsValid() {
				t.Fatalf("%q: key %v for an unparsable address", s, k)
			}
			return
		}
		ip := ap.Addr().Unmap()
		if ip.Is4() && k != ip {
			t.Fatalf("%q: key %v, want %v", s, k, ip)
		}
		if ip.Is6() {
			p, _ := ip.Prefix(64)
			if k != p.Addr() {
				t.Fatalf("%q: key %v, want %v", s, k, p.Addr())
			}
		}
	})
}

// strAddr is a net.Addr with any text.
type strAddr string

func (a strAddr) Network() string { return "tcp" }
func (a strAddr) String() string  { return string(a) }

var _ net.Addr = strAddr("")
