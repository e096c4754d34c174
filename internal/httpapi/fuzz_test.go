package httpapi

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
)

// FuzzRoutes sends random ids, pids, queries and bodies to every route of a
// handler backed by a well-behaved fake: nothing may panic and nothing may
// answer 5xx (every failure is the client's).
//
//	go test -run '^$' -fuzz FuzzRoutes -fuzztime 60s ./internal/httpapi/
func FuzzRoutes(f *testing.F) {
	h := New(&fakeService{}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxBodyBytes: 4096})
	routes := h.(*handler).routes()
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"}

	seeds := []struct {
		route, method uint8
		seg, query    string
		body          []byte
	}{
		{3, 1, "abc", "", []byte(`{"template":"busybox"}`)},
		{7, 1, "abc", "", []byte(`{"cmd":["ls"],"tty":{"rows":1,"cols":1}}`)},
		{7, 1, "abc", "", []byte(`{"command":"x","background":true}`)},
		{9, 0, "7", "replay=true", nil},
		{13, 0, "abc", "path=/etc/passwd", nil},
		{14, 2, "abc", "path=/x&mode=0755&parents=1", []byte("data")},
		{17, 1, "abc", "", []byte(`{"path":"/d","mode":493}`)},
		{18, 1, "abc", "", []byte(`{"from":"/a","to":"/b"}`)},
		{19, 3, "abc", "path=/a%00&recursive=true", nil},
		{24, 1, "", "", []byte(`{"spec":{"name":"t","base":"busybox","steps":[{"copy":{"src":"/a","dst":"/b"}}]}}`)},
		{4, 0, "", "label=a=b&label=%00", nil},
		{5, 0, "../../etc", "", nil},
		{11, 1, "-1", "", []byte(`{"signal":"KILL"}`)},
		{3, 1, "", "", []byte(`{"resources":{"cpus":1e400}}`)},
		{3, 1, "", "", []byte("{\"env\":{\"\\u0000\":\"x\"}} trailing")},
	}
	for _, s := range seeds {
		f.Add(s.route, s.method, s.seg, s.query, s.body)
	}
	f.Fuzz(func(t *testing.T, routeIdx, methodIdx uint8, seg, query string, body []byte) {
		rt := routes[int(routeIdx)%len(routes)]
		method := rt.method
		if methodIdx%4 == 3 { // sometimes a wrong method
			method = methods[int(methodIdx/4)%len(methods)]
		}
		p := rt.pattern
		p = strings.ReplaceAll(p, "{id}", url.PathEscape(seg))
		p = strings.ReplaceAll(p, "{pid}", url.PathEscape(seg))
		p = strings.ReplaceAll(p, "{name}", url.PathEscape(seg))
		u, err := url.Parse(p)
		if err != nil {
			return
		}
		u.RawQuery = query
		req := &http.Request{
			Method: method, URL: u, RequestURI: u.RequestURI(), Host: "localhost",
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		}
		req = req.WithContext(t.Context())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s: status %d: %s", method, u.RequestURI(), rec.Code, rec.Body)
		}
		if rec.Header().Get(api.RequestIDHeader) == "" || rec.Header().Get(api.VersionHeader) == "" {
			t.Fatalf("%s %s: missing headers", method, u.RequestURI())
		}
	})
}
