package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/connlimit"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// listenTCP opens the TCP listener at addr with its defences: connection
// caps (total, per client address, unauthenticated; see
// internal/connlimit) sized so the open-file limit always leaves a reserve
// for the unix socket, the sandboxes and the store, and TLS when
// configured.
func listenTCP(ctx context.Context, e *config.TCPEdge, addr string, log *slog.Logger) (net.Listener, error) {
	var tlsCfg *tls.Config
	if e.TLS() {
		cert, err := tls.LoadX509KeyPair(e.TLSCertFile, e.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading the TLS certificate %s and key %s: %w: %w", e.TLSCertFile, e.TLSKeyFile, err, errdefs.ErrInvalidArgument)
		}
		tlsCfg = &tls.Config{
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS12,
			// HTTP/1.1 only: one connection, one request at a time, which
			// is what the connection caps count.
			NextProtos: []string{"http/1.1"},
		}
	}
	lim := connLimits(e)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	log.InfoContext(ctx, "TCP connection limits", "max", lim.Max, "per_addr", lim.MaxPerAddr, "unauthenticated", lim.MaxUnauthenticated, "unauthenticated_idle", lim.UnauthenticatedIdle)
	var out net.Listener = connlimit.NewListener(ln, lim, log)
	if tlsCfg != nil {
		out = tls.NewListener(out, tlsCfg)
	}
	return out, nil
}

// connLimits are the defaults derived from RLIMIT_NOFILE with the
// configured overrides.
func connLimits(e *config.TCPEdge) connlimit.Limits {
	nofile := uint64(1024) // the usual soft limit, should the call fail
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		nofile = min(rl.Cur, 1<<20) // RLIM_INFINITY: the kernel's nr_open default
	}
	lim := connlimit.DefaultLimits(nofile)
	if e.MaxConns > 0 {
		lim.Max = e.MaxConns
		lim.MaxUnauthenticated = max(e.MaxConns/2, 1)
	}
	if e.MaxConnsPerAddr > 0 {
		lim.MaxPerAddr = e.MaxConnsPerAddr
	}
	return lim
}
