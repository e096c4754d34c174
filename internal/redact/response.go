package redact

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"

	"github.com/agentbox/agentbox/internal/contentcoding"
)

// Response scrubs an upstream response before it is passed to an
// untrusted client that must never see red's values: the headers are
// redacted at once; the body is decoded from every content coding it
// declares (within lim) and redacted as it streams, and its
// Content-Encoding and Content-Length headers are dropped; the trailers
// are redacted when the body has been read to its end. A body whose coding
// cannot be decoded is refused: the error wraps
// contentcoding.ErrUnsupported and resp must not be passed on (a proxy
// answers 502). The redactor must not be used elsewhere meanwhile.
//
// Informational (1xx) responses never reach resp: a RoundTripper
// scrubs them with Trace.
func Response(resp *http.Response, red *Redactor, lim contentcoding.Limits) error {
	redactHeader(resp.Header, red)
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	codings, err := contentcoding.Parse(resp.Header.Values("Content-Encoding"))
	if err != nil {
		return err
	}
	body := resp.Body
	if len(codings) > 0 {
		if body, err = contentcoding.NewReader(resp.Body, codings, lim); err != nil {
			return err
		}
		resp.Header.Del("Content-Encoding")
		resp.Uncompressed = true
	}
	resp.Body = &trailerScrubber{Reader: NewReader(body, red), resp: resp, red: red}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return nil
}

// trailerScrubber redacts its response's trailers once the body ends
// (the transport fills them in when it reads the end of the body).
type trailerScrubber struct {
	*Reader
	resp *http.Response
	red  *Redactor
}

func (t *trailerScrubber) Read(p []byte) (int, error) {
	n, err := t.Reader.Read(p)
	if errors.Is(err, io.EOF) {
		redactHeader(t.resp.Trailer, t.red)
	}
	return n, err
}

func redactHeader(h http.Header, red *Redactor) {
	for k, vs := range h {
		for i, v := range vs {
			vs[i] = red.RedactString(v)
		}
		h[k] = vs
	}
}

// Trace returns ctx with a client trace that redacts values (secret name
// → value) from the headers of every informational (1xx) response in
// place, before hooks registered earlier in ctx see them. A RoundTripper
// adds it to the outgoing request's context, so that it runs before the
// hook of an httputil.ReverseProxy that forwards 1xx responses.
func Trace(ctx context.Context, values map[string][]byte) context.Context {
	red := New(values)
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
			redactHeader(http.Header(h), red)
			return nil
		},
	})
}
