package e2b

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// A sandbox's logs, as E2B's control plane serves them, are agentbox's
// record of its lifecycle: one entry per state transition (created,
// paused, resumed, upgraded, checkpointed, ...), oldest first. Output of
// commands is not kept there (it is in the run records).

type sandboxLog struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

type sandboxLogEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

type sandboxLogs struct {
	Logs       []sandboxLog      `json:"logs"`
	LogEntries []sandboxLogEntry `json:"logEntries"`
}

type sandboxLogsV2 struct {
	Logs []sandboxLogEntry `json:"logs"`
}

// logEntries returns the transitions from start (Unix milliseconds, 0:
// all) on, at most limit (0: all).
func (s *Server) logEntries(r *http.Request) ([]sandboxLogEntry, error) {
	q := r.URL.Query()
	var start int64
	limit := 0
	var err error
	if v := q.Get("start"); v != "" {
		if start, err = strconv.ParseInt(v, 10, 64); err != nil || start < 0 {
			return nil, fmt.Errorf("start %q: want Unix milliseconds: %w", v, errdefs.ErrInvalidArgument)
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 {
			return nil, fmt.Errorf("limit %q: want a number: %w", v, errdefs.ErrInvalidArgument)
		}
	}
	ts, err := s.sb.SandboxTransitions(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	out := []sandboxLogEntry{}
	for _, t := range ts {
		if t.At.UnixMilli() < start {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		out = append(out, logEntryOf(t))
	}
	return out, nil
}

func logEntryOf(t api.Transition) sandboxLogEntry {
	msg := fmt.Sprintf("%s -> %s (%s)", t.From, t.To, t.Cause)
	if t.From == t.To {
		msg = fmt.Sprintf("%s: %s", t.Cause, t.To)
	}
	if t.Detail != "" {
		msg += ": " + t.Detail
	}
	level := "info"
	if t.Cause == api.CauseError || t.To == api.StateFailed {
		level = "error"
	}
	return sandboxLogEntry{Timestamp: t.At, Level: level, Message: msg,
		Fields: map[string]string{"from": t.From, "to": t.To, "cause": t.Cause, "detail": t.Detail}}
}

func (s *Server) logsV1(w http.ResponseWriter, r *http.Request) error {
	es, err := s.logEntries(r)
	if err != nil {
		return err
	}
	out := sandboxLogs{Logs: []sandboxLog{}, LogEntries: es}
	for _, e := range es {
		out.Logs = append(out.Logs, sandboxLog{Timestamp: e.Timestamp, Line: e.Message})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) logsV2(w http.ResponseWriter, r *http.Request) error {
	es, err := s.logEntries(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sandboxLogsV2{Logs: es})
	return nil
}
