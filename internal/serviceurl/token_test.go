package serviceurl

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/store"
)

func testSigner(t testing.TB) *Signer {
	s, err := NewSigner(bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTokenBoundToEveryField(t *testing.T) {
	s := testSigner(t)
	now := time.Unix(1_800_000_000, 0)
	rec := store.ExposureRecord{ID: NewExposureID(), Sandbox: "abcdef012345", Port: 8080, Tenant: "acme", ExpiresAt: now.Add(time.Hour)}
	tok := s.Token(rec)
	p, err := ParseToken(tok)
	if err != nil || p.Link || p.ExposureID != rec.ID {
		t.Fatalf("ParseToken(%q) = %+v, %v", tok, p, err)
	}
	if err := s.Verify(p, rec, now); err != nil {
		t.Fatalf("a good token: %v", err)
	}
	for name, change := range map[string]func(r *store.ExposureRecord){
		"sandbox": func(r *store.ExposureRecord) { r.Sandbox = "abcdef012346" },
		"port":    func(r *store.ExposureRecord) { r.Port = 8081 },
		"tenant":  func(r *store.ExposureRecord) { r.Tenant = "evil" },
		"expiry":  func(r *store.ExposureRecord) { r.ExpiresAt = r.ExpiresAt.Add(time.Hour) },
		"id":      func(r *store.ExposureRecord) { r.ID = NewExposureID() },
	} {
		r := rec
		change(&r)
		if err := s.Verify(p, r, now); err == nil {
			t.Errorf("a token verified against a record with another %s", name)
		}
	}
	if err := s.Verify(p, rec, rec.ExpiresAt); err == nil {
		t.Error("an expired token verified")
	}
	// Another key: refused.
	other, _ := NewSigner(bytes.Repeat([]byte{3}, 32), bytes.Repeat([]byte{4}, 32))
	if err := other.Verify(p, rec, now); err == nil {
		t.Error("a token verified under another key")
	}
	// A link is not a token, and the reverse.
	link := s.Link(rec, now.Add(time.Minute))
	lp, err := ParseToken(link)
	if err != nil || !lp.Link {
		t.Fatalf("ParseToken(link) = %+v, %v", lp, err)
	}
	if err := s.Verify(lp, rec, now); err != nil {
		t.Fatalf("a good link: %v", err)
	}
	if err := s.Verify(lp, rec, now.Add(time.Minute)); err == nil {
		t.Error("an expired link verified")
	}
	forged := tokenPrefix + rec.ID + "." + lp.mac
	if fp, err := ParseToken(forged); err == nil && s.Verify(fp, rec, now) == nil {
		t.Error("a link's MAC verified as a token")
	}
	// Stretching a link's expiry breaks its MAC.
	parts := strings.Split(link, ".")
	parts[2] = "9" + parts[2]
	if sp, err := ParseToken(strings.Join(parts, ".")); err == nil && s.Verify(sp, rec, now) == nil {
		t.Error("a link with a changed expiry verified")
	}
}

func TestParseTokenStrict(t *testing.T) {
	s := testSigner(t)
	rec := store.ExposureRecord{ID: NewExposureID(), Sandbox: "abcdef012345", Port: 1, Tenant: "admin", ExpiresAt: time.Now().Add(time.Hour)}
	tok := s.Token(rec)
	link := s.Link(rec, time.Now().Add(time.Minute))
	for _, bad := range []string{
		"", tok + ".", tok + "=", " " + tok, tok[:len(tok)-1], strings.ToUpper(tok), "abt2" + tok[4:],
		tok[:5] + "ABCDEFGHIJKLMNOP" + tok[21:], link + ".x", strings.Replace(link, ".", ".0", 2),
		strings.Replace(tok, tok[len(tok)-1:], "+", 1),
	} {
		if p, err := ParseToken(bad); err == nil && s.Verify(p, rec, time.Now()) == nil {
			t.Errorf("ParseToken(%q) accepted", bad)
		}
	}
}

// FuzzParseToken: the token parser never panics, and what it accepts has
// the exact shape it promises.
func FuzzParseToken(f *testing.F) {
	s := testSigner(f)
	rec := store.ExposureRecord{ID: "abcdefghij012345", Sandbox: "abcdef012345", Port: 80, Tenant: "acme", ExpiresAt: time.Unix(1_900_000_000, 0)}
	f.Add(s.Token(rec))
	f.Add(s.Link(rec, time.Unix(1_800_000_000, 0)))
	f.Add("abt1.x.y")
	f.Add("abl1.abcdefghij012345.0123.x")
	f.Fuzz(func(t *testing.T, in string) {
		p, err := ParseToken(in)
		if err != nil {
			return
		}
		if !validExposureID(p.ExposureID) || len(p.mac) != macLen {
			t.Fatalf("ParseToken(%q) = %+v", in, p)
		}
		if p.Link && p.Expiry <= 0 {
			t.Fatalf("ParseToken(%q): link without an expiry", in)
		}
		// One spelling: the parts put back together are the input.
		back := tokenPrefix + p.ExposureID + "." + p.mac
		if p.Link {
			back = linkPrefix + p.ExposureID + "." + strconv.FormatInt(p.Expiry, 10) + "." + p.mac
		}
		if back != in {
			t.Fatalf("ParseToken(%q) accepted a non-canonical spelling of %q", in, back)
		}
		_ = s.Verify(p, rec, time.Unix(1_700_000_000, 0))
	})
}
