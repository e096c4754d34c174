// Package redact removes secret values, and their common encodings, from
// streams of bytes. It is the one redactor of agentbox: exec and attach
// output and bridge events (internal/sandbox), bridge connector responses
// (internal/bridge) and intercepted egress responses (internal/egress) all
// use it.
package redact

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"net/url"
	"sort"
)

// Redactor replaces every occurrence of a set of secret values, and of their
// common encodings (standard and URL base64 with and without padding, URL
// query and path escaping, lowercase hex), in streams of output with
// Replacement(name). It works on streams cut into arbitrary chunks: a value
// split across two chunks is still caught, because the end of a chunk that
// could be the start of a value is held back until the next chunk (or Flush)
// decides. Only a genuine partial match is held back, so interactive output
// is not delayed.
//
// Limits: base64 is caught where the value starts on a 3-byte boundary of
// the encoded data (always the case for a value encoded on its own).
//
// A Redactor is not safe for concurrent use; streams are independent (keyed
// by a caller-chosen stream name, e.g. "stdout" and "stderr").
type Redactor struct {
	pats   []pattern // longest needle first
	maxLen int
	tails  map[string][]byte
}

type pattern struct {
	needle []byte
	repl   []byte
}

// Replacement is what replaces a value of the secret named name.
func Replacement(name string) string { return "[REDACTED:" + name + "]" }

// New returns a redactor of values (secret name → value). Empty
// values are ignored. A redactor of no values passes data through.
func New(values map[string][]byte) *Redactor {
	r := &Redactor{tails: map[string][]byte{}}
	seen := map[string]bool{}
	add := func(needle, name string) {
		if needle == "" || seen[needle] {
			return
		}
		seen[needle] = true
		r.pats = append(r.pats, pattern{needle: []byte(needle), repl: []byte(Replacement(name))})
		r.maxLen = max(r.maxLen, len(needle))
	}
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	sort.Strings(names) // deterministic choice between equal needles
	for _, name := range names {
		v := values[name]
		if len(v) == 0 {
			continue
		}
		s := string(v)
		add(s, name)
		add(base64.StdEncoding.EncodeToString(v), name)
		add(base64.RawStdEncoding.EncodeToString(v), name)
		add(base64.URLEncoding.EncodeToString(v), name)
		add(base64.RawURLEncoding.EncodeToString(v), name)
		add(url.QueryEscape(s), name)
		add(url.PathEscape(s), name)
		add(hex.EncodeToString(v), name)
	}
	sort.SliceStable(r.pats, func(i, j int) bool { return len(r.pats[i].needle) > len(r.pats[j].needle) })
	return r
}

// Empty reports whether the redactor has nothing to redact.
func (r *Redactor) Empty() bool { return len(r.pats) == 0 }

// Write redacts the next chunk of stream and returns what can be released
// now (possibly nothing). The returned slice is newly allocated.
func (r *Redactor) Write(stream string, data []byte) []byte {
	if len(r.pats) == 0 {
		return append([]byte(nil), data...)
	}
	buf := append(r.tails[stream], data...)
	out, keep := r.redact(buf, false)
	if keep < len(buf) {
		r.tails[stream] = append([]byte(nil), buf[keep:]...)
	} else {
		delete(r.tails, stream)
	}
	return out
}

// Flush returns what is held back for stream, redacted as the end of the
// stream, and forgets it. Call it when the stream ends.
func (r *Redactor) Flush(stream string) []byte {
	t := r.tails[stream]
	delete(r.tails, stream)
	if len(t) == 0 {
		return nil
	}
	out, _ := r.redact(t, true)
	return out
}

// redact replaces the complete values in buf and returns the output and
// the offset from which buf must be held back (len(buf) when final): the
// earliest position where a value may be forming, i.e. where the rest of
// buf is a proper prefix of a value. A complete value at or after that
// position is held back too, since a longer value starting there may yet
// complete.
func (r *Redactor) redact(buf []byte, final bool) ([]byte, int) {
	out := make([]byte, 0, len(buf))
	pos := 0
	hold := len(buf)
	if !final {
		hold = r.partialFrom(buf, 0)
	}
	for pos < hold {
		at, p := r.earliest(buf[pos:])
		if p == nil || pos+at >= hold {
			break
		}
		out = append(out, buf[pos:pos+at]...)
		out = append(out, p.repl...)
		pos += at + len(p.needle)
		if !final && hold < pos {
			hold = r.partialFrom(buf, pos)
		}
	}
	hold = max(hold, pos)
	out = append(out, buf[pos:hold]...)
	return out, hold
}

// partialFrom returns the smallest k >= from such that buf[k:] is a proper
// prefix of a value, or len(buf).
func (r *Redactor) partialFrom(buf []byte, from int) int {
	for k := max(from, len(buf)-(r.maxLen-1)); k < len(buf); k++ {
		if r.isPrefix(buf[k:]) {
			return k
		}
	}
	return len(buf)
}

// Streams returns the names of the streams with held-back data.
func (r *Redactor) Streams() []string {
	out := make([]string, 0, len(r.tails))
	for s := range r.tails {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// earliest finds the leftmost complete needle in b, the longest one at that
// position.
func (r *Redactor) earliest(b []byte) (int, *pattern) {
	best, bestAt := (*pattern)(nil), -1
	for i := range r.pats {
		p := &r.pats[i]
		limit := len(b)
		if bestAt >= 0 {
			limit = min(len(b), bestAt+len(p.needle)) // a later start cannot win
		}
		at := bytes.Index(b[:limit], p.needle)
		if at < 0 {
			continue
		}
		// pats are longest first: on a tie the earlier (longer) one stays.
		if bestAt < 0 || at < bestAt {
			best, bestAt = p, at
		}
	}
	return bestAt, best
}

func (r *Redactor) isPrefix(b []byte) bool {
	for i := range r.pats {
		if len(b) < len(r.pats[i].needle) && bytes.HasPrefix(r.pats[i].needle, b) {
			return true
		}
	}
	return false
}

// RedactString redacts a whole string at once (headers, log attributes).
func (r *Redactor) RedactString(s string) string {
	if len(r.pats) == 0 {
		return s
	}
	const k = "\x00whole"
	out := r.Write(k, []byte(s))
	return string(append(out, r.Flush(k)...))
}
