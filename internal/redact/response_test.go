package redact

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/contentcoding"
)

func TestResponseDecodesRedactsAndScrubsTrailers(t *testing.T) {
	const secret = "s3cr3t-value-42"
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = io.WriteString(w, "echo: Bearer "+secret+"\n")
	_ = w.Close()
	resp := &http.Response{
		Header:  http.Header{"Content-Encoding": {"gzip"}, "Content-Length": {"99"}, "X-Echo": {"Bearer " + secret}},
		Body:    io.NopCloser(&gz),
		Trailer: http.Header{"X-Trailer": {secret}},
	}
	if err := Response(resp, New(map[string][]byte{"gh": []byte(secret)}), contentcoding.Limits{}); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != "echo: Bearer "+Replacement("gh")+"\n" {
		t.Errorf("body %q", body)
	}
	if resp.Header.Get("Content-Encoding") != "" || resp.Header.Get("Content-Length") != "" || resp.ContentLength != -1 {
		t.Errorf("headers after decoding: %v", resp.Header)
	}
	if strings.Contains(resp.Header.Get("X-Echo"), secret) || strings.Contains(resp.Trailer.Get("X-Trailer"), secret) {
		t.Errorf("header %q, trailer %q", resp.Header.Get("X-Echo"), resp.Trailer.Get("X-Trailer"))
	}
}

func TestResponseRefusesUnknownCoding(t *testing.T) {
	resp := &http.Response{Header: http.Header{"Content-Encoding": {"gzip, x-secret-coding"}}, Body: io.NopCloser(strings.NewReader("x"))}
	if err := Response(resp, New(map[string][]byte{"a": []byte("b")}), contentcoding.Limits{}); !errors.Is(err, contentcoding.ErrUnsupported) {
		t.Fatalf("unknown coding: %v", err)
	}
}

func TestTraceRedacts1xxBeforeEarlierHooks(t *testing.T) {
	var seen string
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(_ int, h textproto.MIMEHeader) error { seen = h.Get("Link"); return nil },
	})
	ctx = Trace(ctx, map[string][]byte{"gh": []byte("s3cr3t")})
	h := textproto.MIMEHeader{"Link": {"</x?s3cr3t>"}}
	if err := httptrace.ContextClientTrace(ctx).Got1xxResponse(103, h); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(seen, "s3cr3t") {
		t.Fatalf("earlier hook saw %q", seen)
	}
}
