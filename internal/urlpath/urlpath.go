// Package urlpath computes the canonical form of an HTTP request path (the
// path an origin server serves once it has decoded what RFC 3986 lets it
// decode and resolved dot segments) and matches path prefixes on segment
// boundaries of that form. A proxy that decides by path (the egress
// proxy's credential rules) matches the canonical path and sends exactly
// that path upstream, so what was matched is what is served.
//
// Encodings that origin servers disagree on are refused rather than
// guessed: an encoded slash or backslash, a raw backslash, NUL and other
// control characters, dot segments hidden by percent-encoding ("%2e%2e")
// or by path parameters ("..;"), and empty segments ("//", which some
// servers merge and some do not).
package urlpath

import (
	"errors"
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// ErrAmbiguous is wrapped by every error of Canonical, together with
// errdefs.ErrInvalidArgument.
var ErrAmbiguous = errors.New("ambiguous request path")

// MaxLen bounds the paths Canonical accepts.
const MaxLen = 8 << 10

// Canonical returns the canonical form of p, an escaped absolute path as
// it appears in a request target (without query or fragment):
//
//   - percent-encoded unreserved characters (ALPHA, DIGIT, "-", ".", "_",
//     "~") are decoded, every other percent-encoding is kept with
//     upper-case hex digits;
//   - characters that may not appear raw in a path (space, '"', '<', '>',
//     '^', '`', '{', '|', '}', non-ASCII bytes) are percent-encoded;
//   - the dot segments "." and ".." are removed (RFC 3986 section 5.2.4).
//
// It fails (wrapping ErrAmbiguous and errdefs.ErrInvalidArgument) for a p
// that is empty, relative or longer than MaxLen (before or after
// escaping), holds an invalid percent-encoding,
// a control character or NUL (raw or encoded), a backslash (raw or
// encoded), an encoded slash, an empty segment other than the last, or a
// segment that is a dot segment only once decoded or once its ";"
// parameters are cut. Canonical is idempotent: Canonical(Canonical(p)) ==
// Canonical(p).
func Canonical(p string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("path %.100q: %s: %w: %w", p, why, ErrAmbiguous, errdefs.ErrInvalidArgument)
	}
	if p == "" || p[0] != '/' {
		return bad("not an absolute path")
	}
	if len(p) > MaxLen {
		return bad("too long")
	}
	segs := strings.Split(p[1:], "/")
	out := make([]string, 0, len(segs))
	for i, raw := range segs {
		if raw == "" && i != len(segs)-1 {
			return bad("empty segment")
		}
		seg, err := canonicalSegment(raw)
		if err != nil {
			return bad(err.Error())
		}
		dot := seg == "." || seg == ".."
		if dot && raw != seg {
			return bad("dot segment hidden by percent-encoding")
		}
		if name, _, ok := strings.Cut(seg, ";"); ok && (name == "." || name == "..") {
			return bad("dot segment with parameters")
		}
		last := i == len(segs)-1
		switch {
		case seg == ".":
			if last {
				out = append(out, "")
			}
		case seg == "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, seg)
		}
	}
	c := "/" + strings.Join(out, "/")
	if len(c) > MaxLen { // escaping grew it
		return bad("too long")
	}
	return c, nil
}

// canonicalSegment canonicalises one segment (no '/').
func canonicalSegment(s string) (string, error) {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return "", errors.New("invalid percent-encoding")
			}
			v := unhex(s[i+1])<<4 | unhex(s[i+2])
			i += 2
			switch {
			case v == '/':
				return "", errors.New("encoded slash")
			case v == '\\':
				return "", errors.New("encoded backslash")
			case v < 0x20 || v == 0x7f:
				return "", errors.New("encoded control character")
			case unreserved(v):
				b.WriteByte(v)
			default:
				writeEscaped(&b, v)
			}
		case c == '\\':
			return "", errors.New("backslash")
		case c < 0x20 || c == 0x7f:
			return "", errors.New("control character")
		case pchar(c):
			b.WriteByte(c)
		default:
			writeEscaped(&b, c)
		}
	}
	return b.String(), nil
}

// HasPrefix reports whether the canonical path p is prefix or lies below
// it, on segment boundaries: "/a" covers "/a", "/a/" and "/a/b" but not
// "/ab"; "/a/" covers "/a/" and "/a/b" but not "/a"; "/" covers every
// path. Both arguments must be canonical (see Canonical).
func HasPrefix(p, prefix string) bool {
	if prefix == "" || prefix == "/" {
		return strings.HasPrefix(p, "/")
	}
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(p, prefix)
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// pchar reports whether c may appear raw in a path segment (RFC 3986
// pchar less pct-encoded).
func pchar(c byte) bool {
	return unreserved(c) || strings.IndexByte("!$&'()*+,;=:@", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

func writeEscaped(b *strings.Builder, c byte) {
	const hexdig = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hexdig[c>>4])
	b.WriteByte(hexdig[c&15])
}
