package egress

import (
	"testing"

	"github.com/agentbox/agentbox/api"
)

// FuzzParseRule: the rule parser never panics; what it accepts is one
// well-formed kind of rule; and an allow rule the internal-address check
// passes under an empty permit list reaches no internal address.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"example.com", "example.com:443", "*.example.com:*", "10.0.0.0/8:*", "[::1]:80", "::ffff:127.0.0.1",
		"0.0.0.0/0:*", "[fd00::/64]:443", "127.1", "0x7f.1:80", "localhost", "*.localhost", "xn--bcher-kva.example", "[::1", "a:b:c"} {
		f.Add(s, true)
	}
	strict := New(Config{Logger: testLogger()})
	f.Fuzz(func(t *testing.T, text string, allow bool) {
		r, err := parseRule(text, allow)
		if err != nil {
			return
		}
		kinds := 0
		if r.Host != "" {
			kinds++
			if c, err := CanonicalHost(r.Host); err != nil || c != r.Host {
				t.Fatalf("%q: host %q is not canonical (%q, %v)", text, r.Host, c, err)
			}
		}
		if r.Suffix != "" {
			kinds++
		}
		if r.Prefix.IsValid() {
			kinds++
			if r.Prefix != r.Prefix.Masked() {
				t.Fatalf("%q: prefix %s not masked", text, r.Prefix)
			}
		}
		if kinds != 1 {
			t.Fatalf("%q: %d kinds in %+v", text, kinds, r)
		}
		if !r.AnyPort && len(r.Ports) == 0 {
			t.Fatalf("%q: no port", text)
		}
		for _, p := range r.Ports {
			if p < 1 || p > 65535 {
				t.Fatalf("%q: port %d", text, p)
			}
		}
		if !allow {
			return
		}
		err = strict.Validate(api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{text}})
		if err == nil && r.Prefix.IsValid() {
			for _, in := range internalRanges {
				if in.Overlaps(r.Prefix) {
					t.Fatalf("%q: accepted, but overlaps %s", text, in)
				}
			}
		}
	})
}
