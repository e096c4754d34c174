package urlpath

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"/":                 "/",
		"/allowed":          "/allowed",
		"/allowed/":         "/allowed/",
		"/allowed/sub":      "/allowed/sub",
		"/allow%65d":        "/allowed",
		"/a%7e%2D%5f":       "/a~-_",
		"/a%2a":             "/a%2A",
		"/a%3f":             "/a%3F",
		"/a%25":             "/a%25",
		"/a b":              "/a%20b",
		"/\xff":             "/%FF",
		"/a/./b":            "/a/b",
		"/a/../b":           "/b",
		"/allowed/../x":     "/x",
		"/../../x":          "/x",
		"/a/..":             "/",
		"/a/.":              "/a/",
		"/a/b/..":           "/a/",
		"/file%2etxt":       "/file.txt",
		"/a;b=c/d":          "/a;b=c/d",
		"/a:b@c!$&'()*+,;=": "/a:b@c!$&'()*+,;=",
	} {
		got, err := Canonical(in)
		if err != nil || got != want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{
		"", "allowed", "*", "//allowed", "/a//b", "/allowed%2fx", "/allowed%2Fx", "/a\\b", "/a%5cb", "/a%5C..",
		"/a%00", "/a\x00", "/a\tb", "/a\x7f", "/a%7f", "/a%0d%0a", "/allowed/%2e%2e/x", "/allowed/%2E%2E/x", "/allowed/.%2e/x",
		"/%2e/x", "/allowed/..;/x", "/allowed/.;x/y", "/a%", "/a%2", "/a%zz", "/a%g0", "/" + strings.Repeat("a", MaxLen),
	} {
		if got, err := Canonical(in); err == nil || !errors.Is(err, ErrAmbiguous) || !errdefs.IsInvalidArgument(err) {
			t.Errorf("Canonical(%q) = %q, %v; want an ambiguous-path error", in, got, err)
		}
	}
}

func TestHasPrefix(t *testing.T) {
	for _, c := range []struct {
		p, prefix string
		want      bool
	}{
		{"/allowed", "/allowed", true},
		{"/allowed/", "/allowed", true},
		{"/allowed/sub", "/allowed", true},
		{"/allowedEXTRA", "/allowed", false},
		{"/allowe", "/allowed", false},
		{"/x", "/allowed", false},
		{"/allowed/sub", "/allowed/", true},
		{"/allowed", "/allowed/", false},
		{"/anything", "/", true},
		{"/anything", "", true},
		{"/a/b/c", "/a/b", true},
		{"/a/bc", "/a/b", false},
	} {
		if got := HasPrefix(c.p, c.prefix); got != c.want {
			t.Errorf("HasPrefix(%q, %q) = %v", c.p, c.prefix, got)
		}
	}
}

// FuzzCanonical checks that Canonical is idempotent, that its output is
// free of what it refuses (so the upstream gets an unambiguous path), and
// that a prefix match survives canonicalising again.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{"/", "/allowed/../x", "/allowed/%2e%2e/x", "//allowed", "/allowed%2fx", "/a\\b", "/a;x/..;/b", "/%41%7e%zz", "/a b/\xff", "/a/./b/../c/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := Canonical(p)
		if err != nil {
			return
		}
		if c == "" || c[0] != '/' || strings.Contains(c, "//") || strings.ContainsAny(c, "\\\x00 ") {
			t.Fatalf("Canonical(%q) = %q", p, c)
		}
		for _, seg := range strings.Split(c[1:], "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("Canonical(%q) = %q keeps a dot segment", p, c)
			}
		}
		c2, err := Canonical(c)
		if err != nil || c2 != c {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", p, c, c2, err)
		}
		if !HasPrefix(c, "/") {
			t.Fatalf("HasPrefix(%q, /) = false", c)
		}
	})
}
