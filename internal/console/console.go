// Package console is the daemon's web console: plain HTML, CSS and
// JavaScript modules (no build step), embedded in the binary and served
// under /ui/ by the HTTP edge (httpapi.Options.Console). The pages talk to
// API v1 from the browser with the API key the user typed, kept in
// sessionStorage and sent as "Authorization: Bearer"; the console itself
// holds no data and no credentials. See docs/CONSOLE.md.
//
// Every response carries a strict Content-Security-Policy (scripts, styles
// and connections from this origin only, no inline script or style, no
// framing), X-Frame-Options DENY and no referrer. The scripts render what
// a sandbox produced (file names, output, commands) as text only
// (textContent, never innerHTML), as it is untrusted.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// CSP is the Content-Security-Policy of every console response.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console's files for request paths under /ui/ (the
// prefix is stripped; "/ui/" is index.html). Safe for concurrent use.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has it
	}
	files := http.StripPrefix("/ui", http.FileServer(http.FS(sub)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hdr := w.Header()
		hdr.Set("Content-Security-Policy", CSP)
		hdr.Set("X-Frame-Options", "DENY")
		hdr.Set("X-Content-Type-Options", "nosniff")
		hdr.Set("Referrer-Policy", "no-referrer")
		hdr.Set("Cross-Origin-Opener-Policy", "same-origin")
		hdr.Set("Cross-Origin-Resource-Policy", "same-origin")
		hdr.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
