package console

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestHandlerHeaders(t *testing.T) {
	h := Handler()
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/style.css"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 200 {
			t.Fatalf("GET %s: %d", path, rec.Code)
		}
		for k, want := range map[string]string{
			"Content-Security-Policy": CSP,
			"X-Frame-Options":         "DENY",
			"X-Content-Type-Options":  "nosniff",
			"Referrer-Policy":         "no-referrer",
		} {
			if got := rec.Header().Get(k); got != want {
				t.Errorf("GET %s: %s = %q, want %q", path, k, got, want)
			}
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/app.js", nil))
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") {
		t.Errorf("app.js content type %q: module scripts need a JavaScript MIME type", ct)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/missing.js", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("missing file: %d", rec.Code)
	}
}

// The CSP forbids inline script and style; the pages must need neither,
// and no script may turn text into markup (the sandbox's data is
// untrusted and is rendered with textContent only).
func TestNoInlineCodeNoHTMLSinks(t *testing.T) {
	if !strings.Contains(CSP, "script-src 'self';") || strings.Contains(CSP, "unsafe-") || !strings.Contains(CSP, "frame-ancestors 'none'") {
		t.Fatalf("CSP %q is not strict", CSP)
	}
	inline := regexp.MustCompile(`(?i)<script(?:\s[^>]*)?>\s*[^<\s]|<style|\son[a-z]+\s*=|\sstyle\s*=|javascript:`)
	sinks := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|setAttribute\(\s*["']on|srcdoc`)
	n := 0
	err := fs.WalkDir(static, "static", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		switch {
		case strings.HasSuffix(path, ".html"):
			if m := inline.Find(b); m != nil {
				t.Errorf("%s: inline code %q", path, m)
			}
		case strings.HasSuffix(path, ".js"):
			if m := sinks.Find(b); m != nil {
				t.Errorf("%s: HTML sink %q", path, m)
			}
		}
		return nil
	})
	if err != nil || n < 5 {
		t.Fatalf("walked %d files: %v", n, err)
	}
}
