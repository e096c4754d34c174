package e2b

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// The parsers of untrusted input: none panics, and what they accept
// keeps its invariants.

func FuzzPageToken(f *testing.F) {
	f.Add(pageToken{id: "abc"}.String())
	f.Add("MTIzLw")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := parsePageToken(s)
		if err != nil {
			return
		}
		if tok.id == "" {
			t.Fatalf("%q: empty id", s)
		}
		if back, err := parsePageToken(tok.String()); err != nil || back.id != tok.id || !back.created.Equal(tok.created) {
			t.Fatalf("%q: no round trip: %v %v", s, back, err)
		}
	})
}

func FuzzListQuery(f *testing.F) {
	f.Add("metadata=k%3Dv&state=running&limit=3")
	f.Add("metadata=%25zz&nextToken=x")
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		lq, err := parseListQuery(q)
		if err != nil {
			return
		}
		for k := range lq.labels {
			if !strings.HasPrefix(k, MetadataPrefix) {
				t.Fatalf("label %q outside the metadata prefix", k)
			}
		}
		if lq.limit < 0 || lq.limit > 1000 {
			t.Fatalf("limit %d", lq.limit)
		}
	})
}

func FuzzResolvePath(f *testing.F) {
	f.Add("a/../../b", "user")
	f.Add("~/x", "root")
	f.Fuzz(func(t *testing.T, p, user string) {
		if !userRE.MatchString(user) {
			return
		}
		got, err := resolvePath(p, user)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/") || strings.Contains(got, "/../") || strings.HasSuffix(got, "/..") || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("resolvePath(%q) = %q", p, got)
		}
	})
}

func FuzzUserHeader(f *testing.F) {
	f.Add("Basic cm9vdDo=")
	f.Add("Basic Og==")
	f.Fuzz(func(t *testing.T, h string) {
		u, err := userOfHeader(http.Header{"Authorization": {h}})
		if err != nil {
			return
		}
		if !userRE.MatchString(u) {
			t.Fatalf("%q gave user %q", h, u)
		}
	})
}

func FuzzAccessToken(f *testing.F) {
	tk := tokens{key: []byte("0123456789abcdef0123456789abcdef")}
	f.Add(tk.mint("a", "sbx"), "sbx")
	f.Add("YQ.x", "sbx")
	f.Fuzz(func(t *testing.T, tok, id string) {
		owner, err := tk.check(tok, id)
		if err != nil {
			return
		}
		if tk.mint(owner, id) != tok {
			t.Fatalf("accepted %q for %q, which is not its token", tok, id)
		}
	})
}

func FuzzPort(f *testing.F) {
	f.Add("49983")
	f.Add("080")
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parsePort(s)
		if err != nil {
			return
		}
		if n < 1 || n > 65535 || s[0] == '0' {
			t.Fatalf("%q accepted as %d", s, n)
		}
	})
}

func FuzzSignal(f *testing.F) {
	f.Add(`"SIGNAL_SIGKILL"`)
	f.Add(`15`)
	f.Fuzz(func(t *testing.T, s string) {
		var sig signal
		_ = json.Unmarshal([]byte(s), &sig)
	})
}
