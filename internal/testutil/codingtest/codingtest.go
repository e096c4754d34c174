// Package codingtest encodes and decodes HTTP content codings for tests:
// the bodies a hostile upstream sends to get a credential past redaction,
// and the decoding a test does to look for it.
package codingtest

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"slices"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// Known are the codings Encode and Decode implement; "raw-deflate" is
// deflate without its zlib wrapper, as some servers send "deflate".
var Known = []string{"gzip", "deflate", "raw-deflate", "br", "zstd"}

// Encode applies codings to b in the order listed (the order
// Content-Encoding lists them). A coding not in Known stands for one no
// proxy can decode: the bytes reversed.
func Encode(t testing.TB, b []byte, codings ...string) []byte {
	t.Helper()
	for _, c := range codings {
		if !slices.Contains(Known, c) {
			b = reversed(b)
			continue
		}
		var buf bytes.Buffer
		var w io.WriteCloser
		switch c {
		case "gzip":
			w = gzip.NewWriter(&buf)
		case "deflate":
			w, _ = zlib.NewWriterLevel(&buf, zlib.BestCompression)
		case "raw-deflate":
			w, _ = flate.NewWriter(&buf, flate.BestCompression)
		case "br":
			w = brotli.NewWriter(&buf)
		case "zstd":
			w, _ = zstd.NewWriter(&buf)
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		b = buf.Bytes()
	}
	return b
}

// Decode undoes codings (listed as Content-Encoding lists them) as far as
// it can and returns every form on the way, b first: a test looks for a
// secret in each.
func Decode(b []byte, codings ...string) [][]byte {
	forms := [][]byte{b}
	for i := len(codings) - 1; i >= 0; i-- {
		var r io.Reader
		var err error
		switch codings[i] {
		case "gzip":
			r, err = gzip.NewReader(bytes.NewReader(b))
		case "deflate":
			r, err = zlib.NewReader(bytes.NewReader(b))
		case "raw-deflate":
			r = flate.NewReader(bytes.NewReader(b))
		case "br":
			r = brotli.NewReader(bytes.NewReader(b))
		case "zstd":
			var d *zstd.Decoder
			if d, err = zstd.NewReader(bytes.NewReader(b)); err == nil {
				defer d.Close()
				r = d
			}
		default:
			b = reversed(b)
			forms = append(forms, b)
			continue
		}
		if err != nil {
			return forms
		}
		out, err := io.ReadAll(r)
		if err != nil || len(out) == 0 {
			return forms
		}
		b = out
		forms = append(forms, b)
	}
	return forms
}

func reversed(b []byte) []byte {
	rev := make([]byte, len(b))
	for i := range b {
		rev[len(b)-1-i] = b[i]
	}
	return rev
}
