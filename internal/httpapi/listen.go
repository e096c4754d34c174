package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/connlimit"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// ListenUnix listens on the unix socket path with mode 0600. The parent
// directory is created 0711 if missing. A socket left behind by a dead
// daemon is replaced; if a live daemon answers on path, ListenUnix fails
// with an error wrapping errdefs.ErrAlreadyExists. A non-socket file at
// path is never removed (errdefs.ErrFailedPrecondition).
//
// The socket is bound under a random name and renamed into place after the
// chmod, so it is never reachable with a wider mode. Closing the listener
// removes path.
func ListenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket: %w", path, errdefs.ErrFailedPrecondition)
		}
		conn, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			conn.Close()
			return nil, fmt.Errorf("another daemon is listening on %s: %w", path, errdefs.ErrAlreadyExists)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, "."+filepath.Base(path)+"."+hex.EncodeToString(rnd[:]))
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ul.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ul.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("placing socket: %w", err)
	}
	return &unixListener{UnixListener: ul, path: path}, nil
}

// unixListener removes its socket file on Close.
type unixListener struct {
	*net.UnixListener
	path string
	once sync.Once
}

func (u *unixListener) Close() error {
	err := u.UnixListener.Close()
	u.once.Do(func() { os.Remove(u.path) })
	return err
}

// Timeouts of the servers made by NewHTTPServer.
const (
	// ReadHeaderTimeout bounds the reading of a request's headers.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout closes a keep-alive connection idle for this long
	// (unauthenticated ones much sooner: see internal/connlimit).
	IdleTimeout = 2 * time.Minute
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes = 64 << 10
)

// NewHTTPServer returns the http.Server for handler h: headers within
// ReadHeaderTimeout and MaxHeaderBytes, idle connections closed after
// IdleTimeout, JSON bodies read within bodyReadTimeout (decodeJSON). There
// is deliberately no ReadTimeout or WriteTimeout: they would cut exec
// output, file transfers and stdin streams, which last as long as the
// command or the transfer. Each request's context carries its connection,
// for connlimit.MarkAuthenticated. Errors of the server go to log at warn
// level.
func NewHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnContext:       connlimit.WithConn,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// Endpoint pairs a listener with the handler serving it (the unix socket
// and TCP get handlers with different Options).
type Endpoint struct {
	Listener net.Listener
	Handler  http.Handler
}

// Server serves several endpoints and shuts them down together.
type Server struct {
	log         *slog.Logger
	servers     []*http.Server
	listeners   []net.Listener
	stopStreams context.CancelFunc
}

// NewServer prepares a server for eps. Streams (exec, attach) are ended as
// soon as Shutdown begins; other requests get the grace period.
func NewServer(log *slog.Logger, eps ...Endpoint) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	streams, stop := context.WithCancel(context.Background())
	base := context.WithValue(context.Background(), streamStopKey{}, streams)
	s := &Server{log: log, stopStreams: stop}
	for _, ep := range eps {
		srv := NewHTTPServer(ep.Handler, log)
		srv.BaseContext = func(net.Listener) context.Context { return base }
		s.servers = append(s.servers, srv)
		s.listeners = append(s.listeners, ep.Listener)
	}
	return s
}

// Serve serves every endpoint and blocks until all have stopped. It returns
// nil after Shutdown, or the first serving error (after shutting the other
// endpoints down).
func (s *Server) Serve() error {
	errs := make(chan error, len(s.servers))
	for i, srv := range s.servers {
		go func() {
			s.log.Info("serving API", "addr", s.listeners[i].Addr().String())
			errs <- srv.Serve(s.listeners[i])
		}()
	}
	var first error
	for range s.servers {
		err := <-errs
		if err != nil && !errors.Is(err, http.ErrServerClosed) && first == nil {
			first = err
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.Shutdown(ctx)
			cancel()
		}
	}
	return first
}

// Shutdown stops accepting, ends every exec/attach stream at once (each
// gets a final "unavailable" error event; the processes keep running), and
// waits for other requests until ctx is done, then closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopStreams()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, srv := range s.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Shutdown(ctx); err != nil {
				_ = srv.Close()
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
