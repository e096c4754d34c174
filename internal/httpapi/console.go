package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// The web console (Options.Console): its static files are served under
// /ui/ before authentication, after the Host check (DNS rebinding); see
// docs/CONSOLE.md.

// isConsolePath reports whether path is the console's.
func isConsolePath(path string) bool {
	return path == "/ui" || strings.HasPrefix(path, "/ui/")
}

// serveConsole serves the console's files to GET and HEAD requests.
func (h *handler) serveConsole(w http.ResponseWriter, r *http.Request) error {
	if h.opts.RequireAuth && !hostAllowed(r.Host, h.opts.AllowedHosts) {
		return fmt.Errorf("host %q is not allowed: %w", r.Host, errdefs.ErrPermissionDenied)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return fmt.Errorf("method %s not allowed on %s: %w", r.Method, r.URL.Path, errdefs.ErrInvalidArgument)
	}
	if r.URL.Path == "/ui" {
		http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
		return nil
	}
	h.opts.Console.ServeHTTP(w, r)
	return nil
}

// isSameOrigin reports whether origin is r's own origin: the same host and
// port, and the scheme r arrived over. Only the console's pages are served
// from that origin (service URLs are other hosts), so such a request comes
// from them; it must still carry an API key like any other.
func isSameOrigin(r *http.Request, origin *url.URL) bool {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return origin.Scheme == scheme && origin.Host != "" && strings.EqualFold(origin.Host, r.Host) && origin.Path == "" && origin.User == nil
}
