package pipeline

import (
	"sync"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
)

// recStream passes a run's events through and finishes its record when
// the exit event passes (before the caller sees it, so a caller that saw
// the exit finds the record finished).
type recStream struct {
	inner execstream.Stream
	rs    *runState

	// mu guards pid and ended.
	mu    sync.Mutex
	pid   int
	ended bool
}

var _ execstream.Stream = (*recStream)(nil)

// Next implements execstream.Stream.
func (s *recStream) Next() (api.ExecEvent, error) {
	ev, err := s.inner.Next()
	if err != nil {
		return ev, err
	}
	switch ev.Type {
	case api.EventStarted:
		s.mu.Lock()
		s.pid = ev.Pid
		s.mu.Unlock()
		s.rs.notePid(ev.Pid)
	case api.EventStdout, api.EventStderr:
		s.rs.addOutput(ev.Data)
	case api.EventExit, api.EventError:
		s.mu.Lock()
		s.ended = true
		s.mu.Unlock()
		s.rs.finish(&ev, nil)
	}
	return ev, nil
}

// Close implements execstream.Stream: a caller that leaves before the
// exit leaves the process running, and its run is finished when the
// process exits.
func (s *recStream) Close() error {
	err := s.inner.Close()
	s.mu.Lock()
	ended, pid := s.ended, s.pid
	s.ended = true
	s.mu.Unlock()
	if !ended {
		go s.rs.follow(s.rs.sandboxID(), pid)
	}
	return err
}

func (rs *runState) sandboxID() string {
	rs.p.mu.Lock()
	defer rs.p.mu.Unlock()
	return rs.rec.Sandbox
}
