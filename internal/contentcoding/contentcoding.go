// Package contentcoding decodes HTTP message bodies from their content
// codings (RFC 9110 section 8.4: gzip, deflate, br, zstd, stacked), within
// bounds on the decoded size, the decoding ratio, the number of stacked
// codings and the decoders' memory. A proxy that must inspect a body (to
// scrub secrets from it) decodes it first; a coding it cannot decode is an
// error, never a reason to pass the body on unread.
package contentcoding

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// ErrUnsupported is wrapped by errors about codings this package does not
// decode (or too many stacked codings).
var ErrUnsupported = errors.New("unsupported content coding")

// ErrTooLarge is returned by a decoding reader whose output passed its
// Limits.
var ErrTooLarge = errors.New("decoded body exceeds its limit")

// Limits bound one decoded body.
type Limits struct {
	// MaxBytes is the most decoded bytes (default 1 GiB).
	MaxBytes int64
	// MaxRatio is the most decoded bytes per encoded byte once more than
	// RatioAfter bytes were decoded (default 1000).
	MaxRatio int64
	// RatioAfter (default 4 MiB) lets small, very compressible bodies pass.
	RatioAfter int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = 1 << 30
	}
	if l.MaxRatio <= 0 {
		l.MaxRatio = 1000
	}
	if l.RatioAfter <= 0 {
		l.RatioAfter = 4 << 20
	}
	return l
}

// MaxStacked is the most codings one body may stack.
const MaxStacked = 4

// zstdMaxWindow is the largest zstd window accepted (RFC 9659 bounds HTTP's
// to 8 MiB); zstdMaxMemory bounds the decoder's allocations.
const (
	zstdMaxWindow = 8 << 20
	zstdMaxMemory = 64 << 20
)

// Parse returns the codings the Content-Encoding header values list, in the
// order they were applied, lower-cased, without "identity". It fails
// (wrapping ErrUnsupported) on a coding other than gzip (x-gzip), deflate,
// br and zstd, or on more than MaxStacked of them.
func Parse(values []string) ([]string, error) {
	var out []string
	for _, v := range values {
		for _, c := range strings.Split(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			switch c {
			case "", "identity":
			case "gzip", "x-gzip":
				out = append(out, "gzip")
			case "deflate", "br", "zstd":
				out = append(out, c)
			default:
				return nil, fmt.Errorf("content coding %.40q: %w", c, ErrUnsupported)
			}
		}
	}
	if len(out) > MaxStacked {
		return nil, fmt.Errorf("%d stacked content codings: %w", len(out), ErrUnsupported)
	}
	return out, nil
}

// NewReader returns body decoded from codings (as Parse returns them:
// the first applied first), bounded by lim. Closing it closes body and the
// decoders. Read errors of a corrupt encoding are returned as they come;
// nothing decoded after an error is returned.
func NewReader(body io.ReadCloser, codings []string, lim Limits) (io.ReadCloser, error) {
	if len(codings) > MaxStacked {
		return nil, fmt.Errorf("%d stacked content codings: %w", len(codings), ErrUnsupported)
	}
	lim = lim.withDefaults()
	in := &countReader{r: body}
	d := &decoded{body: body, in: in, lim: lim}
	var r io.Reader = in
	for i := len(codings) - 1; i >= 0; i-- {
		next, closer, err := layer(codings[i], r)
		if err != nil {
			d.Close()
			return nil, err
		}
		if closer != nil {
			d.closers = append(d.closers, closer)
		}
		r = next
	}
	d.r = r
	return d, nil
}

// layer returns a reader decoding one coding from r, lazily: nothing is
// read from r before the first Read.
func layer(coding string, r io.Reader) (io.Reader, func(), error) {
	switch coding {
	case "gzip":
		l := &lazy{open: func() (io.Reader, error) { return gzip.NewReader(r) }}
		return l, nil, nil
	case "deflate":
		// RFC 9110 "deflate" is zlib-wrapped; some servers send a raw
		// deflate stream. The zlib header tells them apart.
		l := &lazy{open: func() (io.Reader, error) {
			br := bufio.NewReader(r)
			h, err := br.Peek(2)
			if err == nil && h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
				return zlib.NewReader(br)
			}
			return flate.NewReader(br), nil
		}}
		return l, nil, nil
	case "br":
		return brotli.NewReader(r), nil, nil
	case "zstd":
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow),
			zstd.WithDecoderMaxMemory(zstdMaxMemory), zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd decoder: %w", err)
		}
		return zr, zr.Close, nil
	default:
		return nil, nil, fmt.Errorf("content coding %.40q: %w", coding, ErrUnsupported)
	}
}

// lazy opens its reader (which reads a header) on the first Read.
type lazy struct {
	open func() (io.Reader, error)
	r    io.Reader
	err  error
}

func (l *lazy) Read(p []byte) (int, error) {
	if l.r == nil && l.err == nil {
		l.r, l.err = l.open()
		if errors.Is(l.err, io.EOF) {
			l.err = io.ErrUnexpectedEOF
		}
	}
	if l.err != nil {
		return 0, l.err
	}
	return l.r.Read(p)
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// decoded is the bounded decoding reader NewReader returns.
type decoded struct {
	body    io.Closer
	in      *countReader
	r       io.Reader
	closers []func()
	lim     Limits
	out     int64
	err     error
}

func (d *decoded) Read(p []byte) (int, error) {
	if d.err != nil {
		return 0, d.err
	}
	if room := d.lim.MaxBytes - d.out + 1; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := d.r.Read(p)
	d.out += int64(n)
	if d.out > d.lim.MaxBytes || d.out > d.lim.RatioAfter && d.out > d.lim.MaxRatio*max(d.in.n, 1) {
		d.err = fmt.Errorf("%d bytes decoded from %d: %w", d.out, d.in.n, ErrTooLarge)
		return 0, d.err
	}
	if err != nil {
		d.err = err
	}
	return n, err
}

func (d *decoded) Close() error {
	for _, c := range d.closers {
		c()
	}
	d.closers = nil
	return d.body.Close()
}
