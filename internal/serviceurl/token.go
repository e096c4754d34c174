package serviceurl

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// Tokens.
//
// An exposure's token is "abt1.<exposure id>.<mac>", where mac is the
// HMAC-SHA256, under a key derived from the daemon's master key (kept
// outside the data directory), of the exposure's id, sandbox, port, tenant
// and expiry. The token holds no claim of its own: the gateway looks the
// exposure up by id (a revoked or expired one is gone), recomputes the MAC
// from the record and compares in constant time. So a token is bound to
// (sandbox, port, expiry, tenant), and revoking is deleting the record.
//
// A browser link's parameter is "abl1.<exposure id>.<expiry>.<mac>": the
// same over the record and the link's own, short expiry, under another
// derived key, so a link parameter is never a token and the reverse.

const (
	tokenPrefix = "abt1."
	linkPrefix  = "abl1."
	// exposureIDLen is the length of exposure ids.
	exposureIDLen = 16
	// macLen is the length of a base64url (unpadded) SHA-256 MAC.
	macLen = 43
)

// Purposes of the keys derived from the master key.
const (
	PurposeTokens = "agentbox service tokens v1 HMAC-SHA256"
	PurposeLinks  = "agentbox service links v1 HMAC-SHA256"
)

// Signer mints and checks tokens and link parameters. Safe for concurrent
// use (it holds only its keys).
type Signer struct {
	tokenKey, linkKey []byte
}

// NewSigner returns a signer with the two keys (each at least 32 bytes,
// distinct: derive them from the master key with PurposeTokens and
// PurposeLinks).
func NewSigner(tokenKey, linkKey []byte) (*Signer, error) {
	if len(tokenKey) < 32 || len(linkKey) < 32 || hmac.Equal(tokenKey, linkKey) {
		return nil, fmt.Errorf("service URL keys must be two distinct keys of 32 bytes or more: %w", errdefs.ErrInvalidArgument)
	}
	return &Signer{tokenKey: tokenKey, linkKey: linkKey}, nil
}

// NewExposureID returns a fresh exposure id: 16 lower-case letters and
// digits.
func NewExposureID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [exposureIDLen]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// validExposureID reports whether s has the shape NewExposureID makes.
func validExposureID(s string) bool {
	if len(s) != exposureIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// ValidExposureID reports whether s has the shape of an exposure id.
func ValidExposureID(s string) bool { return validExposureID(s) }

// bound is what a MAC covers: every field a token is bound to, each
// length-prefixed so no two records share a message.
func bound(kind string, rec store.ExposureRecord, extra int64) []byte {
	var b strings.Builder
	for _, f := range []string{kind, rec.ID, rec.Sandbox, strconv.Itoa(rec.Port), rec.Tenant,
		strconv.FormatInt(rec.ExpiresAt.Unix(), 10), strconv.FormatInt(extra, 10)} {
		b.WriteString(strconv.Itoa(len(f)))
		b.WriteByte(':')
		b.WriteString(f)
	}
	return []byte(b.String())
}

func mac(key, msg []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Token returns the token of rec.
func (s *Signer) Token(rec store.ExposureRecord) string {
	return tokenPrefix + rec.ID + "." + mac(s.tokenKey, bound("token", rec, 0))
}

// Link returns a link parameter for rec valid until exp.
func (s *Signer) Link(rec store.ExposureRecord, exp time.Time) string {
	e := exp.Unix()
	return linkPrefix + rec.ID + "." + strconv.FormatInt(e, 10) + "." + mac(s.linkKey, bound("link", rec, e))
}

// ParsedToken is a token or link parameter split into its parts, not yet
// checked against any record.
type ParsedToken struct {
	Link       bool
	ExposureID string
	Expiry     int64 // links only
	mac        string
}

// ParseToken splits a token or a link parameter strictly: the prefix, an
// exposure id of the right shape, for a link a canonical decimal expiry,
// and a MAC of the right length in unpadded base64url. It checks nothing
// against a key or record (VerifyToken does).
func ParseToken(s string) (ParsedToken, error) {
	bad := fmt.Errorf("malformed service token: %w", errdefs.ErrUnauthenticated)
	var p ParsedToken
	rest, ok := strings.CutPrefix(s, tokenPrefix)
	if !ok {
		if rest, ok = strings.CutPrefix(s, linkPrefix); !ok {
			return p, bad
		}
		p.Link = true
	}
	parts := strings.Split(rest, ".")
	if (!p.Link && len(parts) != 2) || (p.Link && len(parts) != 3) {
		return p, bad
	}
	p.ExposureID, p.mac = parts[0], parts[len(parts)-1]
	if !validExposureID(p.ExposureID) || len(p.mac) != macLen {
		return p, bad
	}
	if _, err := base64.RawURLEncoding.Strict().DecodeString(p.mac); err != nil {
		return p, bad
	}
	if p.Link {
		e := parts[1]
		if e == "" || len(e) > 12 || e[0] == '0' {
			return p, bad
		}
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil || strconv.FormatInt(n, 10) != e {
			return p, bad
		}
		p.Expiry = n
	}
	return p, nil
}

// Verify checks p against rec (the record of p.ExposureID) at now: the MAC
// in constant time, and the expiry of the record and, for a link, of the
// link. Every failure is the same error.
func (s *Signer) Verify(p ParsedToken, rec store.ExposureRecord, now time.Time) error {
	var want string
	if p.Link {
		want = mac(s.linkKey, bound("link", rec, p.Expiry))
	} else {
		want = mac(s.tokenKey, bound("token", rec, 0))
	}
	ok := hmac.Equal([]byte(want), []byte(p.mac))
	ok = ok && p.ExposureID == rec.ID && now.Before(rec.ExpiresAt)
	ok = ok && (!p.Link || now.Unix() < p.Expiry)
	if !ok {
		return fmt.Errorf("service token rejected: %w", errdefs.ErrUnauthenticated)
	}
	return nil
}
