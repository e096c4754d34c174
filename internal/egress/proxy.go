package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Resolver resolves host names for the proxy. *net.Resolver implements it;
// tests map names to loopback addresses.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// SecretSource gives the proxy the values of stored secrets for credential
// injection. Values are used for one request and never logged or recorded.
type SecretSource interface {
	Secret(ctx context.Context, name string) ([]byte, error)
}

// Config configures a Proxy.
type Config struct {
	// Resolver resolves destination names (default net.DefaultResolver).
	Resolver Resolver
	// Secrets supplies injected credentials; nil refuses credential rules.
	Secrets SecretSource
	// RootCAs verifies upstream certificates of intercepted destinations
	// (nil: the system roots).
	RootCAs *x509.CertPool
	// Permit lists the internal address ranges (and ports) the proxy may
	// dial for sandboxes whose policy allows them, e.g. an internal
	// package mirror (see ParsePermit). Internal addresses outside it are
	// never dialled, whatever a sandbox's rules say, and allow rules
	// naming them are refused.
	Permit []*Rule
	// SelfPorts are the ports of the daemon's own TCP listeners: the proxy
	// never dials them on a loopback, unspecified or host address, even
	// where Permit covers the address.
	SelfPorts []int
	// DialTimeout bounds resolving plus connecting (default 10s).
	DialTimeout time.Duration
	// MaxRecords is the number of egress records kept per sandbox (default 1000).
	MaxRecords int
	// RunOf names the run a new proxy connection of a sandbox is
	// attributed to ("" for none); its records carry that run id. It is
	// called once per proxy connection. Nil: records carry no run id.
	RunOf func(ctx context.Context, sandboxID string) string
	// OnRecord, when set, is called with every record (every decision)
	// after it is kept, synchronously on the proxy connection's
	// goroutine: it must return quickly (the daemon counts decisions for
	// its metrics).
	OnRecord func(rec api.EgressRecord)
	Logger   *slog.Logger
}

// Proxy is the egress proxy of every sandbox of a daemon. It is safe for
// concurrent use.
type Proxy struct {
	cfg       Config
	log       *slog.Logger
	hostAddrs hostAddrCache

	// mu guards sandboxes.
	mu        sync.Mutex
	sandboxes map[string]*sandbox
}

// sandbox is one sandbox's proxy state.
type sandbox struct {
	id      string
	ca      *CA
	records *recordRing
	policy  atomic.Pointer[Policy]
}

// New returns a Proxy.
func New(cfg Config) *Proxy {
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Proxy{cfg: cfg, log: cfg.Logger, sandboxes: make(map[string]*sandbox)}
}

// Validate checks a network spec without applying it: its syntax, and
// that its allow rules name no internal address the daemon does not
// permit (errdefs.ErrInvalidArgument).
func (p *Proxy) Validate(spec api.NetworkSpec) error {
	pol, err := p.parse(spec)
	if err != nil {
		return err
	}
	return p.validateInternal(pol)
}

// parse parses spec and checks that its credential rules can be served.
func (p *Proxy) parse(spec api.NetworkSpec) (*Policy, error) {
	pol, err := ParsePolicy(spec)
	if err != nil {
		return nil, err
	}
	if len(pol.Credentials) > 0 && p.cfg.Secrets == nil {
		return nil, fmt.Errorf("credential rules need a secret store: %w", errdefs.ErrFailedPrecondition)
	}
	return pol, nil
}

// Configure installs (or replaces) the policy of a sandbox, loading or
// creating its interception CA in stateDir (a host-only directory), and
// returns the CA certificate in PEM form. A policy recorded before rules
// naming internal addresses were refused is installed as it is (the
// sandbox is re-adopted): such rules reach nothing, since every dial is
// checked.
func (p *Proxy) Configure(sandboxID, stateDir string, spec api.NetworkSpec) ([]byte, error) {
	pol, err := p.parse(spec)
	if err != nil {
		return nil, err
	}
	if err := p.validateInternal(pol); err != nil {
		p.log.Warn("egress policy names internal addresses; they stay unreachable", "sandbox", sandboxID, "err", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	sb := p.sandboxes[sandboxID]
	if sb == nil {
		ca, err := LoadOrCreateCA(stateDir, "agentbox sandbox "+sandboxID+" egress CA")
		if err != nil {
			return nil, err
		}
		sb = &sandbox{id: sandboxID, ca: ca, records: newRecordRing(p.cfg.MaxRecords)}
		p.sandboxes[sandboxID] = sb
	}
	sb.policy.Store(pol)
	return sb.ca.CertPEM(), nil
}

// Remove forgets a sandbox: its connections are refused from now on.
func (p *Proxy) Remove(sandboxID string) {
	p.mu.Lock()
	delete(p.sandboxes, sandboxID)
	p.mu.Unlock()
}

// Records returns up to limit of a sandbox's newest records, oldest first.
func (p *Proxy) Records(sandboxID string, limit int) []api.EgressRecord {
	sb := p.get(sandboxID)
	if sb == nil {
		return nil
	}
	return sb.records.list(limit)
}

func (p *Proxy) get(id string) *sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sandboxes[id]
}

func (p *Proxy) record(sb *sandbox, rec api.EgressRecord) {
	rec.Time = time.Now().UTC()
	rec.SandboxID = sb.id
	sb.records.add(rec)
	p.log.Info("egress", "sandbox", sb.id, "run", rec.RunID, "kind", rec.Kind, "dest", rec.Destination, "addr", rec.Address,
		"method", rec.Method, "path", rec.Path, "status", rec.Status, "decision", rec.Decision, "rule", rec.Rule,
		"reason", rec.Reason, "up", rec.BytesUp, "down", rec.BytesDown, "credentials", rec.Credentials)
	if p.cfg.OnRecord != nil {
		p.cfg.OnRecord(rec)
	}
}

// ServeConn serves one proxy connection made inside sandboxID and closes
// it. Connections of sandboxes that are not configured are closed at once.
func (p *Proxy) ServeConn(ctx context.Context, sandboxID string, conn net.Conn) {
	sb := p.get(sandboxID)
	if sb == nil {
		conn.Close()
		return
	}
	var run string
	if p.cfg.RunOf != nil {
		run = p.cfg.RunOf(ctx, sandboxID)
	}
	srv := &http.Server{
		Handler:           &front{p: p, sb: sb, ctx: ctx, run: run},
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	_ = srv.Serve(newOneConnListener(conn))
}

// front serves the requests a sandbox sends to the proxy.
type front struct {
	p   *Proxy
	sb  *sandbox
	ctx context.Context // the proxy connection's
	run string          // the run the connection is attributed to, if any
}

// record records rec for the front's sandbox and run.
func (f *front) record(rec api.EgressRecord) {
	rec.RunID = f.run
	f.p.record(f.sb, rec)
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		f.connect(w, r)
	case r.URL.IsAbs() && r.URL.Scheme == "http":
		f.forward(w, r)
	default:
		http.Error(w, "agentbox egress proxy: only CONNECT and absolute http:// requests", http.StatusBadRequest)
	}
}

// target is a checked destination.
type target struct {
	dest string // host:port as asked
	host string // canonical
	port int
	addr netip.AddrPort
	dec  Decision
	pol  *Policy
}

// check applies the sandbox's policy to host and port, resolves a name
// once and picks an address that may be dialled.
func (f *front) check(ctx context.Context, host string, port int) (*target, error) {
	t := &target{dest: net.JoinHostPort(host, strconv.Itoa(port)), port: port, pol: f.sb.policy.Load()}
	canon, err := CanonicalHost(host)
	if err != nil {
		t.dec = Decision{Reason: err.Error()}
		return t, errDenied
	}
	t.host = canon
	if port < 1 || port > 65535 {
		t.dec = Decision{Reason: "port out of range"}
		return t, errDenied
	}
	t.dec = t.pol.checkDest(canon, port)
	if !t.dec.Allowed {
		return t, errDenied
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(canon); err == nil {
		addrs = []netip.Addr{a}
	} else {
		rctx, cancel := context.WithTimeout(ctx, f.p.cfg.DialTimeout)
		addrs, err = f.p.cfg.Resolver.LookupNetIP(rctx, "ip", canon)
		cancel()
		if err != nil || len(addrs) == 0 {
			t.dec = Decision{Rule: t.dec.Rule, Reason: "name does not resolve"}
			return t, errUnresolved
		}
	}
	// Every address must pass: a name that resolves to anything internal
	// is refused as a whole (no rebinding game picks the other one).
	for _, a := range addrs {
		if why := f.p.forbidden(a, port); why != "" {
			t.dec = Decision{Rule: t.dec.Rule, Reason: "resolves to " + why + " (" + a.Unmap().String() + ")"}
			return t, errDenied
		}
	}
	t.addr = netip.AddrPortFrom(addrs[0].Unmap(), uint16(port))
	return t, nil
}

var (
	errDenied     = errors.New("denied by egress policy")
	errUnresolved = errors.New("name does not resolve")
)

// dial connects to exactly the checked address; the address the socket
// connects to is checked once more.
func (p *Proxy) dial(ctx context.Context, t *target) (net.Conn, error) {
	d := net.Dialer{Timeout: p.cfg.DialTimeout, ControlContext: p.controlDial}
	return d.DialContext(ctx, "tcp", t.addr.String())
}

// controlDial refuses to connect a socket to an address the proxy must not
// dial.
func (p *Proxy) controlDial(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("egress dial to %q: %w", address, errDenied)
	}
	if why := p.forbidden(ap.Addr(), int(ap.Port())); why != "" {
		return fmt.Errorf("egress dial to %s, %s: %w", address, why, errDenied)
	}
	return nil
}

func (f *front) deny(w http.ResponseWriter, kind string, t *target, err error, method, path string) {
	status := http.StatusForbidden
	if errors.Is(err, errUnresolved) {
		status = http.StatusBadGateway
	}
	f.record(api.EgressRecord{Kind: kind, Destination: t.dest, Method: method, Path: path, Status: status,
		Decision: api.EgressDenied, Rule: t.dec.Rule, Reason: t.dec.Reason})
	http.Error(w, "agentbox egress proxy: "+t.dest+": "+t.dec.Reason, status)
}

func splitPort(hostport string, def int) (string, int, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		if def == 0 {
			return "", 0, err
		}
		return hostport, def, nil
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return "", 0, fmt.Errorf("port %q is not a number", ps)
	}
	return host, port, nil
}

// connect serves CONNECT: a plain tunnel, or TLS interception when the
// destination carries credential rules.
func (f *front) connect(w http.ResponseWriter, r *http.Request) {
	host, port, err := splitPort(r.Host, 0)
	if err != nil {
		http.Error(w, "agentbox egress proxy: CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	t, err := f.check(r.Context(), host, port)
	if err != nil {
		f.deny(w, "connect", t, err, "", "")
		return
	}
	creds := t.pol.credentialsFor(t.host, t.port)
	var up net.Conn
	if len(creds) == 0 {
		up, err = f.p.dial(r.Context(), t)
		if err != nil {
			f.record(api.EgressRecord{Kind: "connect", Destination: t.dest, Address: t.addr.String(), Decision: api.EgressError, Rule: t.dec.Rule, Reason: "dial failed"})
			http.Error(w, "agentbox egress proxy: cannot connect to "+t.dest, http.StatusBadGateway)
			return
		}
		defer up.Close()
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "agentbox egress proxy: cannot hijack", http.StatusInternalServerError)
		return
	}
	cc, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer cc.Close()
	if _, err := io.WriteString(cc, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	client := &bufConn{Conn: cc, r: brw.Reader}
	if len(creds) > 0 {
		f.intercept(client, t, creds)
		return
	}
	upN, downN := splice(client, up)
	f.record(api.EgressRecord{Kind: "connect", Destination: t.dest, Address: t.addr.String(),
		Decision: api.EgressAllowed, Rule: t.dec.Rule, BytesUp: upN, BytesDown: downN})
}

// splice copies both ways until both directions end; it returns the bytes
// sent up (client to upstream) and down.
func splice(client, up net.Conn) (upN, downN int64) {
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(up, client)
		if tc, ok := up.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		done <- n
	}()
	downN, _ = io.Copy(client, up)
	if tc, ok := client.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	} else {
		_ = client.Close()
	}
	upN = <-done
	return upN, downN
}

// forward serves an absolute-form plain-HTTP request. Credentials are never
// injected over plaintext.
func (f *front) forward(w http.ResponseWriter, r *http.Request) {
	host, port, err := splitPort(r.URL.Host, 80)
	if err != nil {
		http.Error(w, "agentbox egress proxy: bad host", http.StatusBadRequest)
		return
	}
	t, err := f.check(r.Context(), host, port)
	if err != nil {
		f.deny(w, "http", t, err, r.Method, r.URL.Path)
		return
	}
	rec := api.EgressRecord{Kind: "http", Destination: t.dest, Address: t.addr.String(), Method: r.Method, Path: r.URL.Path,
		Decision: api.EgressAllowed, Rule: t.dec.Rule}
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return f.p.dial(ctx, t) },
		DisableKeepAlives: true,
		Proxy:             nil,
	}
	defer tr.CloseIdleConnections()
	cw := &countingWriter{ResponseWriter: w}
	body := &countingReader{r: r.Body}
	r.Body = body
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.dest
			pr.Out.Host = r.URL.Host
			pr.Out.Header.Del("Proxy-Authorization")
		},
		Transport: tr,
		ErrorLog:  slog.NewLogLogger(f.p.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			rec.Decision, rec.Reason = api.EgressError, "upstream request failed"
			http.Error(w, "agentbox egress proxy: upstream request failed", http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(cw, r)
	rec.Status, rec.BytesUp, rec.BytesDown = cw.status, body.n, cw.n
	f.record(rec)
}

// bufConn reads through a bufio.Reader that may hold bytes already.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

type countingWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// oneConnListener hands out one connection, then blocks until it is closed.
type oneConnListener struct {
	conn   net.Conn
	once   sync.Once
	closed chan struct{}
}

func newOneConnListener(c net.Conn) *oneConnListener {
	l := &oneConnListener{closed: make(chan struct{})}
	l.conn = &notifyConn{Conn: c, l: l}
	return l
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.conn })
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// notifyConn ends its listener when closed.
type notifyConn struct {
	net.Conn
	l    *oneConnListener
	once sync.Once
}

func (c *notifyConn) Close() error {
	c.once.Do(func() { close(c.l.closed) })
	return c.Conn.Close()
}
