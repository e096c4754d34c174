package runsecrets

import (
	"sync"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// runStream wraps the event stream of an exec or attach: it redacts secret
// values from output (a value split across two events is still caught: the
// redactor holds back a partial match until the next event or the end) and
// ends the stream's run, revoking its token, when the exit event passes —
// before the event is delivered, so a client that has seen the exit can
// rely on the token being dead.
type runStream struct {
	inner execstream.Stream
	red   *redact.Redactor // nil: nothing to redact
	// onExit runs once, when the exit or error event passes.
	onExit func()
	// onDetach runs once, when the stream is closed before the exit.
	onDetach func()

	queue []api.ExecEvent

	// mu guards fired.
	mu    sync.Mutex
	fired bool
}

// wrapStream returns s wrapped for sandbox h when there is anything to
// redact or a run to end; otherwise s itself.
func (m *Secrets) wrapStream(h *sandbox.Handle, s execstream.Stream, r *run, pid int) execstream.Stream {
	red := m.Redactor(h.ID())
	if red == nil && r == nil {
		return s
	}
	rs := &runStream{inner: s, red: red}
	if r != nil {
		m.setRunPid(r, pid)
		rs.onExit = func() { m.endRun(r) }
		rs.onDetach = func() { m.followRun(h, r, pid) }
	}
	return rs
}

// Next implements execstream.Stream.
func (s *runStream) Next() (api.ExecEvent, error) {
	for {
		if len(s.queue) > 0 {
			ev := s.queue[0]
			s.queue = s.queue[1:]
			return ev, nil
		}
		ev, err := s.inner.Next()
		if err != nil {
			// A broken stream drops what the redactor holds back: a partial
			// secret is not released unchecked.
			return ev, err
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			if s.red == nil {
				return ev, nil
			}
			ev.Data = s.red.Write(ev.Type, ev.Data)
			if len(ev.Data) == 0 {
				continue
			}
			return ev, nil
		case api.EventExit, api.EventError:
			if s.red != nil {
				for _, t := range []string{api.EventStdout, api.EventStderr} {
					if d := s.red.Flush(t); len(d) > 0 {
						s.queue = append(s.queue, api.ExecEvent{Type: t, Pid: ev.Pid, Data: d})
					}
				}
			}
			s.fire(true)
			s.queue = append(s.queue, ev)
			continue
		}
		return ev, nil
	}
}

// fire runs onExit (exited) or onDetach once.
func (s *runStream) fire(exited bool) {
	s.mu.Lock()
	if s.fired {
		s.mu.Unlock()
		return
	}
	s.fired = true
	s.mu.Unlock()
	if exited && s.onExit != nil {
		s.onExit()
	} else if !exited && s.onDetach != nil {
		s.onDetach()
	}
}

// Close implements execstream.Stream. Closing before the exit leaves the process
// running; its run then ends when the process does.
func (s *runStream) Close() error {
	err := s.inner.Close()
	s.fire(false)
	return err
}
