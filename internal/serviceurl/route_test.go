package serviceurl

import (
	"strconv"
	"testing"
)

func TestParsePortCanonical(t *testing.T) {
	for _, s := range []string{"1", "80", "8080", "65535"} {
		if p, err := ParsePort(s); err != nil || strconv.Itoa(p) != s {
			t.Errorf("ParsePort(%q) = %d, %v", s, p, err)
		}
	}
	for _, s := range []string{"", "0", "080", "+80", "-80", "0x50", " 80", "80 ", "8_0", "65536", "99999", "100000", "1e3", "８０", "80\x00", "%38%30"} {
		if p, err := ParsePort(s); err == nil {
			t.Errorf("ParsePort(%q) = %d, want an error", s, p)
		}
	}
}

func TestParsePath(t *testing.T) {
	const id = "abcdef012345"
	good := map[string]struct {
		port int
		rest string
	}{
		"/v1/sandboxes/" + id + "/ports/8080/":        {8080, "/"},
		"/v1/sandboxes/" + id + "/ports/8080":         {8080, "/"},
		"/v1/sandboxes/" + id + "/ports/80/a/b%2Fc?x": {80, "/a/b%2Fc?x"},
		"/v1/sandboxes/" + id + "/ports/1/index.html": {1, "/index.html"},
	}
	for p, want := range good {
		tg, rest, err := ParsePath(p)
		if err != nil || tg.Sandbox != id || tg.Port != want.port || rest != want.rest {
			t.Errorf("ParsePath(%q) = %+v %q %v", p, tg, rest, err)
		}
		if !IsServicePath(p) {
			t.Errorf("IsServicePath(%q) = false", p)
		}
	}
	for _, p := range []string{
		"/v1/sandboxes/" + id + "/ports/080/", "/v1/sandboxes/" + id + "/ports/+80/", "/v1/sandboxes/" + id + "/ports/0x50/",
		"/v1/sandboxes/" + id + "/ports/%2080/", "/v1/sandboxes/" + id + "/ports/80%20/", "/v1/sandboxes/" + id + "/ports/",
		"/v1/sandboxes/" + id + "/ports", "/v1/sandboxes/my-name/ports/80/", "/v1/sandboxes/ABCDEF012345/ports/80/",
		"/v1/sandboxes/" + id + "/ports/70000/",
	} {
		if tg, _, err := ParsePath(p); err == nil {
			t.Errorf("ParsePath(%q) = %+v, want an error", p, tg)
		}
		if !IsServicePath(p) {
			t.Errorf("IsServicePath(%q) = false: a malformed service address must not reach the API", p)
		}
	}
	for _, p := range []string{"/v1/sandboxes/" + id + "/exec", "/v1/sandboxes", "/v1/sandboxes/" + id, "/v1/sandboxes/" + id + "/portsx/80/"} {
		if IsServicePath(p) {
			t.Errorf("IsServicePath(%q) = true", p)
		}
	}
	if got := PathOf(Target{Sandbox: id, Port: 80}); got != "/v1/sandboxes/"+id+"/ports/80/" {
		t.Errorf("PathOf = %q", got)
	}
}

func TestParseHost(t *testing.T) {
	const id = "abcdef012345"
	const dom = "sb.example.com"
	for _, h := range []string{"8080-" + id + ".sb.example.com", "8080-" + id + ".SB.Example.com:443", "8080-" + id + ".sb.example.com."} {
		tg, ok, err := ParseHost(h, dom)
		if !ok || err != nil || tg.Sandbox != id || tg.Port != 8080 {
			t.Errorf("ParseHost(%q) = %+v %v %v", h, tg, ok, err)
		}
	}
	for _, h := range []string{"080-" + id + ".sb.example.com", "+80-" + id + ".sb.example.com", "0x50-" + id + ".sb.example.com",
		"80-" + id + "x.sb.example.com", "a.80-" + id + ".sb.example.com", "80" + id + ".sb.example.com", "80-.sb.example.com"} {
		if tg, ok, err := ParseHost(h, dom); !ok || err == nil {
			t.Errorf("ParseHost(%q) = %+v %v %v, want under the domain but refused", h, tg, ok, err)
		}
	}
	for _, h := range []string{"sb.example.com", "80-" + id + ".example.com", "127.0.0.1:8080", "80-" + id + ".sb.example.com.evil"} {
		if _, ok, _ := ParseHost(h, dom); ok {
			t.Errorf("ParseHost(%q) claims a host outside the domain", h)
		}
	}
	if _, ok, _ := ParseHost("80-"+id+".sb.example.com", ""); ok {
		t.Error("no domain: nothing is host-based")
	}
}

// FuzzServiceAddress: parsing never panics, and whatever parses is in its
// one canonical spelling (printing the target back gives the input).
func FuzzServiceAddress(f *testing.F) {
	for _, s := range []string{"/v1/sandboxes/abcdef012345/ports/8080/x", "080", "/v1/sandboxes/abcdef012345/ports/0x50/", "80-abcdef012345.sb.example.com", "65535", " 80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := ParsePort(s); err == nil && strconv.Itoa(p) != s {
			t.Fatalf("ParsePort(%q) = %d: not canonical", s, p)
		}
		if tg, rest, err := ParsePath(s); err == nil {
			if !IsServicePath(s) || len(rest) == 0 || rest[0] != '/' {
				t.Fatalf("ParsePath(%q) = %+v %q", s, tg, rest)
			}
			prefix := PathOf(tg)
			if s+"/" != prefix && s[:min(len(s), len(prefix))] != prefix {
				t.Fatalf("ParsePath(%q) = %+v: not its canonical path %q", s, tg, prefix)
			}
		}
		if tg, ok, err := ParseHost(s, "sb.example.com"); ok && err == nil {
			if !ValidSandboxID(tg.Sandbox) || tg.Port < 1 || tg.Port > 65535 {
				t.Fatalf("ParseHost(%q) = %+v", s, tg)
			}
		}
	})
}
