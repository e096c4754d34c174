package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/e2b"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/serviceurl"
	"github.com/agentbox/agentbox/internal/tenant"
)

// codePort serves the code interpreter's port (e2b.CodeInterpreterPort)
// through the E2B front door: the code server inside the sandbox
// (`agentbox guest code-server`, internal/codeinterp) listens on
// 127.0.0.1:49999, and the requests the @e2b/code-interpreter SDK sends
// to that port are proxied to it by serviceurl's Proxy, through the
// guest's dial operation (a sandbox has no route from the host). The
// front door has checked the sandbox's access token and put its owner in
// the request's context.
//
// The server is started on a sandbox's first request, by running the
// runner's `code-client start` as the user "user" in /home/user through
// the one execute path (a run of trigger e2b, recorded like any other);
// it is idempotent, so a second start (another request racing, a daemon
// restart) finds the server running. When the server went away (it was
// stopped inside, or a restore did not bring it back), the request that
// finds nothing listening starts it again and is sent once more (bodies
// up to maxRetryBody; a longer one answers unavailable, and the next
// request starts the server).
//
// It is a sandbox.DeleteHook so a deleted sandbox is forgotten. Bind
// must be called before the first request. Safe for concurrent use.
type codePort struct {
	exec  func(ctx context.Context, id string, req api.ExecRequest) (api.ExecEvent, string, error)
	proxy *serviceurl.Proxy
	log   *slog.Logger

	// mu guards started.
	mu      sync.Mutex
	started map[string]*codeStart
}

// codeStart is one sandbox's server start: mu serialises starts, ok says
// one succeeded.
type codeStart struct {
	mu sync.Mutex
	ok bool
}

var (
	_ e2b.PortHandler    = (*codePort)(nil)
	_ sandbox.DeleteHook = (*codePort)(nil)
)

func newCodePort(log *slog.Logger) *codePort {
	return &codePort{log: log, started: map[string]*codeStart{}}
}

// Name implements sandbox.Extension.
func (c *codePort) Name() string { return "e2b-code-interpreter" }

// OnDelete implements sandbox.DeleteHook.
func (c *codePort) OnDelete(ctx context.Context, id string) {
	c.mu.Lock()
	delete(c.started, id)
	c.mu.Unlock()
}

// bind gives the port the execute path (svc's E2B Exec) and the proxy.
func (c *codePort) bind(svc e2bService, proxy *serviceurl.Proxy) {
	c.proxy = proxy
	c.exec = func(ctx context.Context, id string, req api.ExecRequest) (api.ExecEvent, string, error) {
		st, err := svc.Exec(ctx, id, req)
		if err != nil {
			return api.ExecEvent{}, "", err
		}
		defer st.Close()
		var out strings.Builder
		for {
			ev, err := st.Next()
			if err == io.EOF {
				return api.ExecEvent{}, out.String(), fmt.Errorf("the stream ended without an exit: %w", errdefs.ErrUnavailable)
			}
			if err != nil {
				return api.ExecEvent{}, out.String(), err
			}
			switch ev.Type {
			case api.EventStdout, api.EventStderr:
				if out.Len() < 4<<10 {
					out.Write(ev.Data)
				}
			case api.EventExit, api.EventError:
				return ev, out.String(), nil
			}
		}
	}
}

func (c *codePort) entry(id string) *codeStart {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.started[id]
	if !ok {
		e = &codeStart{}
		c.started[id] = e
	}
	return e
}

// ensure starts sandbox id's code server unless this daemon did already.
func (c *codePort) ensure(ctx context.Context, id string) error {
	e := c.entry(id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ok {
		return nil
	}
	cmd := append(append([]string{}, httpapi.CodeClient...), "start")
	ev, out, err := c.exec(ctx, id, api.ExecRequest{Cmd: cmd, User: e2b.DefaultUser, Cwd: e2b.DefaultHome})
	if err != nil {
		return fmt.Errorf("starting the code interpreter of sandbox %s: %w", id, err)
	}
	if ev.Type == api.EventError && ev.Error != nil {
		return fmt.Errorf("starting the code interpreter of sandbox %s: %s: %w", id, ev.Error.Message, errdefs.ErrUnavailable)
	}
	if ev.ExitCode == nil || *ev.ExitCode != 0 {
		c.log.WarnContext(ctx, "code interpreter did not start", "sandbox", id, "output", out)
		return fmt.Errorf("the code interpreter of sandbox %s did not start (does the template have python3?): %w", id, errdefs.ErrUnavailable)
	}
	e.ok = true
	return nil
}

func (c *codePort) forget(id string) {
	c.mu.Lock()
	delete(c.started, id)
	c.mu.Unlock()
}

// maxRetryBody is the largest request body kept to send again when the
// code server has to be started again (a cell's code and its context).
const maxRetryBody = 1 << 20

// ServeSandboxPort implements e2b.PortHandler.
func (c *codePort) ServeSandboxPort(w http.ResponseWriter, r *http.Request, id string) error {
	if c.proxy == nil || c.exec == nil {
		return fmt.Errorf("the code interpreter port is not bound: %w", errdefs.ErrInternal)
	}
	if err := c.ensure(r.Context(), id); err != nil {
		if errdefs.IsNotFound(err) {
			c.forget(id)
		}
		return err
	}
	body, again := keepBody(r, maxRetryBody)
	req := serviceurl.Request{Target: serviceurl.Target{Sandbox: id, Port: e2b.CodeInterpreterPort}}
	err := c.proxy.Serve(w, r, req)
	if errdefs.IsUnavailable(err) && again {
		// Nothing listens (nothing was written): the server went away
		// since this daemon started it (a restore without its
		// processes). Start it again and send the request once more.
		c.forget(id)
		if err := c.ensure(r.Context(), id); err != nil {
			return err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		err = c.proxy.Serve(w, r, req)
	}
	if errdefs.IsUnavailable(err) || errdefs.IsNotFound(err) {
		c.forget(id) // the next request starts it again
	}
	return err
}

// keepBody reads r's body when it has at most limit bytes and puts a
// copy back, so the request can be sent twice (again); a longer body is
// left to stream, once.
func keepBody(r *http.Request, limit int64) (body []byte, again bool) {
	if r.Body == nil || r.Body == http.NoBody {
		r.Body = http.NoBody
		return nil, true
	}
	if r.ContentLength > limit {
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil || int64(len(b)) > limit {
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), r.Body))
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return b, true
}

// e2bHosts is host-based addressing of the E2B front door under the
// service domain: {port}-{id}.{domain} (serviceurl's parsing); ports
// other than envd's and the code interpreter's are service URLs, served
// by the service URL gateway with exposure tokens.
type e2bHosts struct {
	domain   string // without a port
	services *serviceurl.Exposures
}

var _ e2b.HostRouter = e2bHosts{}

func newE2BHosts(domain string, services *serviceurl.Exposures) e2bHosts {
	if h, _, err := net.SplitHostPort(domain); err == nil {
		domain = h
	}
	return e2bHosts{domain: domain, services: services}
}

// ParseHost implements e2b.HostRouter.
func (h e2bHosts) ParseHost(host string) (string, int, bool, error) {
	t, ok, err := serviceurl.ParseHost(host, h.domain)
	return t.Sandbox, t.Port, ok, err
}

// ServeOtherPort implements e2b.HostRouter.
func (h e2bHosts) ServeOtherPort(w http.ResponseWriter, r *http.Request, admit func(tenant.Principal) error) error {
	return h.services.ServeService(w, r, admit)
}
