// Package guest is the in-sandbox agent: it runs as PID 1 of a sandbox
// (started by nsinit after the namespaces, root filesystem and security
// posture are set up) and serves exec and file operations for the daemon
// over the wire protocol of package proto.
//
// As PID 1 the guest reaps every zombie: one reaper goroutine owns wait4 and
// every process is started through it (never os/exec). Processes keep their
// newest output in a bounded replay buffer so clients can re-attach, and
// their exit status is kept for the last maxExited processes.
//
// Everything the guest opens is close-on-exec (and Serve marks every
// inherited descriptor above 2 close-on-exec), so started processes get
// exactly stdin, stdout and stderr.
package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// Options configure Serve.
type Options struct {
	// Version is reported by the version operation. VersionOf, when set,
	// is asked instead, at every version operation (so a guest need not
	// work its version out before anyone asks).
	Version   string
	VersionOf func() string
	// Logger receives the guest's log; nil discards it.
	Logger *slog.Logger
	// MaxOutputBuffer is the per-process replay buffer in bytes (newest
	// output kept); default 1 MiB.
	MaxOutputBuffer int
	// ExecCgroup is the directory of the cgroup v2 cgroup the guest runs
	// in, delegated to it, in which every exec gets a cgroup of its own
	// (see execCgroups); nil: execs get none.
	ExecCgroup *os.File
	// Embedded serves the guest inside a process that is not a sandbox's
	// PID 1 (the in-process test backend, internal/runtime/inproc): the
	// reaper waits only for the processes this Serve started, so several
	// Serves may run in one process beside os/exec, and inherited
	// descriptors are left as they are. Orphans are not reaped. A Serve
	// that is not Embedded must not run in the same process: its reaper
	// takes every child's status, and an Embedded one would wait forever.
	Embedded bool
	// Env is added to the environment of every process started, before
	// the request's own variables (which win).
	Env map[string]string
}

const (
	defaultOutputBuffer = 1 << 20
	maxExited           = 1000
	headerTimeout       = 10 * time.Second
	drainTimeout        = 5 * time.Second
)

type server struct {
	opts   Options
	log    *slog.Logger
	etc    string // directory holding passwd and group
	reaper *reaper
	cgs    *execCgroups
	dom    *domains
	table  *table
	tun    *tunnels
}

// Serve accepts connections on ln and serves each on its own goroutine
// until ctx is done. It then closes ln and every open connection, kills the
// process groups it started, and returns nil. It returns an error when ln
// fails for another reason.
//
// Serve reaps every child of the current process (as PID 1 of a sandbox it
// inherits all orphans), so the calling process must not wait for its own
// children by other means (os/exec) while Serve runs. Only one Serve may
// run per process, unless opts.Embedded is set.
func Serve(ctx context.Context, ln net.Listener, opts Options) error {
	if opts.MaxOutputBuffer <= 0 {
		opts.MaxOutputBuffer = defaultOutputBuffer
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !opts.Embedded {
		if err := markFDsCloexec(); err != nil {
			log.Warn("marking inherited descriptors close-on-exec", "err", err)
		}
	}
	cgs := newExecCgroups(opts.ExecCgroup, log)
	s := &server{opts: opts, log: log, etc: "/etc", reaper: newReaper(cgs.sweep, opts.Embedded), cgs: cgs, dom: newDomains(log), table: newTable(maxExited), tun: newTunnels(log)}
	defer s.reaper.close()
	defer s.tun.close()

	var (
		mu    sync.Mutex // guards conns
		conns = make(map[net.Conn]struct{})
		wg    sync.WaitGroup
	)
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()

	var serveErr error
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			serveErr = fmt.Errorf("accepting guest connections: %w", err)
			break
		}
		mu.Lock()
		conns[conn] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handle(conn)
			mu.Lock()
			delete(conns, conn)
			mu.Unlock()
		}()
	}
	ln.Close()
	mu.Lock()
	for c := range conns {
		c.Close()
	}
	mu.Unlock()
	wg.Wait()
	s.killAll()
	return serveErr
}

// killAll kills the process groups still running and waits a little for
// their exit statuses.
func (s *server) killAll() {
	deadline := time.After(time.Second)
	for _, info := range s.table.list() {
		if !info.Running {
			continue
		}
		p, err := s.table.get(info.Pid)
		if err != nil {
			continue
		}
		_ = p.signal(syscall.SIGKILL)
		select {
		case <-p.reaped:
		case <-deadline:
			return
		}
	}
}

// conn is one connection's buffered reader and writer.
type conn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func (c *conn) frame(t proto.FrameType, b []byte) error { return proto.WriteFrame(c.bw, t, b) }

// reply writes a terminal Result frame and flushes.
func (c *conn) reply(v any) error {
	if err := proto.WriteJSONFrame(c.bw, proto.FrameResult, v); err != nil {
		return err
	}
	return c.bw.Flush()
}

func (s *server) handle(nc net.Conn) {
	defer nc.Close()
	c := &conn{Conn: nc, br: bufio.NewReaderSize(nc, 16<<10), bw: bufio.NewWriterSize(nc, 16<<10)}
	_ = nc.SetReadDeadline(time.Now().Add(headerTimeout))
	req, err := proto.ReadRequest(c.br)
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			s.fail(c, err)
		}
		return
	}
	_ = nc.SetReadDeadline(time.Time{})
	if err := s.dispatch(c, req); err != nil {
		s.log.Debug("guest operation failed", "op", req.Op, "err", err)
		s.fail(c, err)
	}
}

// fail sends err as an Error frame, then discards what the client still
// sends (so it reads the error rather than a reset connection).
func (s *server) fail(c *conn, err error) {
	if werr := proto.WriteJSONFrame(c.bw, proto.FrameError, proto.NewError(err)); werr != nil {
		return
	}
	if c.bw.Flush() != nil {
		return
	}
	if uc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		_ = uc.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(drainTimeout))
	_, _ = io.Copy(io.Discard, c.br)
}

func (s *server) dispatch(c *conn, req *proto.Request) error {
	switch req.Op {
	case proto.OpVersion:
		v := s.opts.Version
		if s.opts.VersionOf != nil {
			v = s.opts.VersionOf()
		}
		return c.reply(proto.VersionReply{Version: v, Protocol: proto.Version})
	case proto.OpExec, proto.OpStart:
		if req.Exec == nil {
			return fmt.Errorf("%s without exec request: %w", req.Op, errdefs.ErrInvalidArgument)
		}
		if req.Op == proto.OpStart {
			p, err := s.start(req.Exec, nil)
			if err != nil {
				return err
			}
			return c.reply(p.info())
		}
		sub := newSubscriber()
		p, err := s.start(req.Exec, sub)
		if err != nil {
			return err
		}
		return s.stream(c, p, nil, sub)
	case proto.OpAttach:
		p, err := s.table.get(req.Pid)
		if err != nil {
			return err
		}
		buffered, sub := p.subscribe(req.Replay)
		return s.stream(c, p, buffered, sub)
	case proto.OpProcesses:
		return c.reply(s.table.list())
	case proto.OpActivity:
		r := s.activity()
		r.PrivateExecs = s.table.privateExecs.Load()
		return c.reply(r)
	case proto.OpStdin:
		return s.stdin(c, req)
	case proto.OpSignal:
		sig, err := parseSignal(req.Signal)
		if err != nil {
			return err
		}
		p, err := s.table.get(req.Pid)
		if err != nil {
			return err
		}
		if err := p.signal(sig); err != nil {
			return err
		}
		return c.reply(nil)
	case proto.OpResize:
		if req.TTY == nil {
			return fmt.Errorf("resize without size: %w", errdefs.ErrInvalidArgument)
		}
		p, err := s.table.get(req.Pid)
		if err != nil {
			return err
		}
		if err := p.resize(*req.TTY); err != nil {
			return err
		}
		return c.reply(nil)
	case proto.OpReadFile:
		return s.readFile(c, req)
	case proto.OpWriteFile:
		return s.writeFile(c, req)
	case proto.OpStat:
		return s.stat(c, req)
	case proto.OpList:
		return s.list(c, req)
	case proto.OpMkdir:
		return s.mkdir(c, req)
	case proto.OpMove:
		return s.move(c, req)
	case proto.OpRemove:
		return s.remove(c, req)
	case proto.OpReadArchive:
		return s.readArchive(c, req)
	case proto.OpWriteArchive:
		return s.writeArchive(c, req)
	case proto.OpTunnel:
		return s.tunnel(c, req)
	case proto.OpDial:
		return s.dial(c, req)
	case proto.OpWatch:
		return s.watch(c, req)
	}
	return fmt.Errorf("unknown operation %q: %w", req.Op, errdefs.ErrNotImplemented)
}

// stream sends Started, the buffered output, the live output of sub and
// finally Exit, while applying the client's control frames.
func (s *server) stream(c *conn, p *process, buffered []chunk, sub *subscriber) error {
	defer p.unsubscribe(sub)
	if err := proto.WriteJSONFrame(c.bw, proto.FrameStarted, proto.Started{Pid: p.pid, TTY: p.tty}); err != nil {
		return err
	}
	for _, ch := range buffered {
		if err := c.frame(ch.stream, ch.data); err != nil {
			return err
		}
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		s.control(c, p)
	}()
	if sub != nil {
	live:
		for {
			select {
			case ch := <-sub.ch:
				if err := c.frame(ch.stream, ch.data); err != nil {
					return err
				}
				if len(sub.ch) == 0 {
					if err := c.bw.Flush(); err != nil {
						return err
					}
				}
			case <-p.done:
				for {
					select {
					case ch := <-sub.ch:
						if err := c.frame(ch.stream, ch.data); err != nil {
							return err
						}
					default:
						break live
					}
				}
			case <-gone:
				return nil // client went away; the process keeps running
			}
		}
	}
	<-p.done
	if err := proto.WriteJSONFrame(c.bw, proto.FrameExit, p.exitInfo()); err != nil {
		return err
	}
	return c.bw.Flush()
}

// control applies the frames a client sends during exec or attach until
// the connection ends or a frame is malformed.
func (s *server) control(c *conn, p *process) {
	for {
		t, b, err := proto.ReadFrame(c.br)
		if err != nil {
			return
		}
		switch t {
		case proto.FrameStdin:
			err = p.writeStdin(b)
		case proto.FrameCloseStdin:
			p.closeStdin(true)
		case proto.FrameResize:
			var tty api.TTY
			if err = json.Unmarshal(b, &tty); err == nil {
				err = p.resize(tty)
			}
		case proto.FrameSignal:
			var sig syscall.Signal
			if sig, err = parseSignal(string(b)); err == nil {
				err = p.signal(sig)
			}
		default:
			s.log.Debug("unexpected frame during exec", "type", t.String(), "pid", p.pid)
			return
		}
		if err != nil {
			s.log.Debug("exec control frame failed", "type", t.String(), "pid", p.pid, "err", err)
		}
	}
}

// stdin copies Stdin frames to a process until EOF.
func (s *server) stdin(c *conn, req *proto.Request) error {
	p, err := s.table.get(req.Pid)
	if err != nil {
		return err
	}
	for {
		t, b, err := proto.ReadFrame(c.br)
		if err != nil {
			return fmt.Errorf("reading stdin frames: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		switch t {
		case proto.FrameStdin, proto.FrameData:
			if err := p.writeStdin(b); err != nil {
				return err
			}
			continue
		case proto.FrameEOF:
		default:
			return fmt.Errorf("unexpected %s frame in stdin stream: %w", t, errdefs.ErrInvalidArgument)
		}
		break
	}
	if req.CloseStdin {
		p.closeStdin(true)
	}
	return c.reply(nil)
}
