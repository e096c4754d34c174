package contentcoding

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/codingtest"
)

func decode(b []byte, header string, lim Limits) ([]byte, error) {
	codings, err := Parse([]string{header})
	if err != nil {
		return nil, err
	}
	r, err := NewReader(io.NopCloser(bytes.NewReader(b)), codings, lim)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func TestRoundTrips(t *testing.T) {
	plain := []byte(strings.Repeat("the secret is hunter2; ", 500))
	for _, c := range []struct {
		header string
		apply  []string
	}{
		{"", nil},
		{"identity", nil},
		{"gzip", []string{"gzip"}},
		{"X-GZIP", []string{"gzip"}},
		{"deflate", []string{"deflate"}},
		{"deflate", []string{"raw-deflate"}},
		{"br", []string{"br"}},
		{"zstd", []string{"zstd"}},
		{"gzip, br", []string{"gzip", "br"}},
		{"zstd,gzip, deflate", []string{"zstd", "gzip", "deflate"}},
		{"gzip, identity", []string{"gzip"}},
	} {
		got, err := decode(codingtest.Encode(t, plain, c.apply...), c.header, Limits{})
		if err != nil || !bytes.Equal(got, plain) {
			t.Errorf("%q: %d bytes, %v", c.header, len(got), err)
		}
	}
}

func TestRefusals(t *testing.T) {
	for _, h := range []string{"compress", "x-unknown", "gzip, x-unknown", "gzip,gzip,gzip,gzip,gzip", "br;q=1"} {
		if _, err := Parse([]string{h}); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Parse(%q): %v", h, err)
		}
	}
	// Corrupt data is an error, not a pass-through.
	for _, h := range []string{"gzip", "deflate", "br", "zstd"} {
		if out, err := decode([]byte("not compressed at all, the secret is hunter2"), h, Limits{}); err == nil {
			t.Errorf("%s of garbage: %q, no error", h, out)
		}
	}
	// An empty body under a coding is an error too.
	if _, err := decode(nil, "gzip", Limits{}); err == nil {
		t.Error("empty gzip body: no error")
	}
}

func TestBombsAreBounded(t *testing.T) {
	zeros := make([]byte, 16<<20)
	for _, c := range []string{"gzip", "br", "zstd"} {
		bomb := codingtest.Encode(t, zeros, c)
		_, err := decode(bomb, c, Limits{})
		if !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s bomb (%d bytes): %v", c, len(bomb), err)
		}
	}
	if _, err := decode(codingtest.Encode(t, []byte(strings.Repeat("x", 10000)), "gzip"), "gzip", Limits{MaxBytes: 1000}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("MaxBytes: %v", err)
	}
}

// FuzzDecode: decoding never panics, never exceeds its limit, and what
// decodes is what was encoded.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("hello"), "gzip", false)
	f.Add(codingtest.Encode(f, []byte("hello hello hello"), "gzip"), "gzip", false)
	f.Add(codingtest.Encode(f, []byte("hello"), "deflate"), "deflate", false)
	f.Add(codingtest.Encode(f, []byte("hello"), "raw-deflate"), "deflate", false)
	f.Add(codingtest.Encode(f, []byte("hello"), "br"), "br", false)
	f.Add(codingtest.Encode(f, []byte("hello"), "zstd"), "zstd", false)
	f.Add(codingtest.Encode(f, []byte("hello"), "gzip", "br"), "gzip, br", false)
	f.Add([]byte("hello"), "gzip", true)
	f.Fuzz(func(t *testing.T, data []byte, header string, roundTrip bool) {
		const maxBytes = 1 << 20
		if roundTrip {
			codings, err := Parse([]string{header})
			if err != nil {
				return
			}
			var apply []string
			apply = append(apply, codings...)
			enc := codingtest.Encode(t, data, apply...)
			got, err := decode(enc, header, Limits{MaxBytes: maxBytes, MaxRatio: 1 << 20})
			if len(data) <= maxBytes && (err != nil || !bytes.Equal(got, data)) {
				t.Fatalf("round trip %q of %d bytes: %d bytes, %v", header, len(data), len(got), err)
			}
			return
		}
		got, _ := decode(data, header, Limits{MaxBytes: maxBytes})
		if len(got) > maxBytes {
			t.Fatalf("%d bytes decoded, limit %d", len(got), maxBytes)
		}
	})
}
