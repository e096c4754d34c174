package e2b

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// DefaultTimeout is a sandbox's lifetime when create names none (E2B's).
const DefaultTimeout = 300 * time.Second

// maxBody bounds control-plane request bodies.
const maxBody = 1 << 20

// controlFunc is a control-plane handler; its error is answered by
// writeError.
type controlFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) controlRoutes() {
	for pattern, fn := range map[string]controlFunc{
		"POST /sandboxes":                 s.create,
		"POST /v2/sandboxes":              s.create,
		"GET /sandboxes":                  s.listV1,
		"GET /v2/sandboxes":               s.list,
		"GET /sandboxes/{id}":             s.get,
		"DELETE /sandboxes/{id}":          s.kill,
		"POST /sandboxes/{id}/timeout":    s.setTimeout,
		"POST /sandboxes/{id}/refreshes":  s.refresh,
		"POST /sandboxes/{id}/pause":      s.pause,
		"POST /sandboxes/{id}/resume":     s.connect,
		"POST /sandboxes/{id}/connect":    s.connect,
		"POST /v2/sandboxes/{id}/connect": s.connect,
		"POST /sandboxes/{id}/fork":       s.fork,
		"POST /sandboxes/{id}/snapshots":  s.createSnapshot,
		"GET /snapshots":                  s.listSnapshots,
		"DELETE /templates/{id}":          s.deleteSnapshot,
		"GET /sandboxes/{id}/metrics":     s.metrics,
		"GET /sandboxes/{id}/logs":        s.logsV1,
		"GET /v2/sandboxes/{id}/logs":     s.logsV2,
		"GET /health":                     func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(http.StatusOK); return nil },
	} {
		s.control.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if err := fn(w, r); err != nil {
				writeError(w, r, s.log, err)
			}
		})
	}
}

// decodeBody decodes an optional JSON body leniently: E2B's SDKs send
// fields this front end ignores.
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("reading the request body: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(b) > maxBody {
		return fmt.Errorf("request body over %d bytes: %w", maxBody, errdefs.ErrTooLarge)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding the request body: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// createRequest maps E2B's create body to agentbox's request: the
// template through the mapping, metadata into labels, the timeout into
// the hard lifetime (autoPause: into the idle pause, never deleted).
func (s *Server) createRequest(body newSandbox) (api.CreateSandboxRequest, error) {
	e2bTemplate := cmp.Or(body.TemplateID, "base")
	req := api.CreateSandboxRequest{
		Template: e2bTemplate,
		Env:      body.EnvVars,
		Labels:   map[string]string{LabelTemplate: e2bTemplate},
	}
	if t, ok := s.cfg.Templates[e2bTemplate]; ok {
		req.Template = t
	}
	labels, err := metadataLabels(body.Metadata)
	if err != nil {
		return api.CreateSandboxRequest{}, err
	}
	for k, v := range labels {
		req.Labels[k] = v
	}
	timeout := int64(DefaultTimeout / time.Second)
	if body.Timeout != nil {
		if *body.Timeout <= 0 {
			return api.CreateSandboxRequest{}, fmt.Errorf("timeout %d: want a positive number of seconds: %w", *body.Timeout, errdefs.ErrInvalidArgument)
		}
		timeout = *body.Timeout
	}
	if body.AutoPause {
		req.Labels[LabelAutoPause] = "true"
		req.Lifecycle = api.LifecyclePersistent
		req.Idle = &api.IdlePolicy{PauseAfterSeconds: timeout, HibernateAfterSeconds: -1, DeleteAfterSeconds: -1}
	} else {
		req.TimeoutSeconds = timeout
	}
	return req, nil
}

// metadataLabels turns E2B metadata into labels under MetadataPrefix,
// each key escaped to the characters a label key may hold (metaKey).
func metadataLabels(md map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(md))
	for k, v := range md {
		if k == "" {
			return nil, fmt.Errorf("metadata key is empty: %w", errdefs.ErrInvalidArgument)
		}
		out[MetadataPrefix+metaKey(k)] = v
	}
	return out, nil
}

// metaKey escapes a metadata key for a label key: letters, digits, "."
// and "-" stay, every other byte is "_" and two hex digits.
func metaKey(k string) string {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02x", c)
		}
	}
	return b.String()
}

// unMetaKey reverses metaKey; ok is false for a label metaKey cannot
// have made.
func unMetaKey(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '_' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(n))
		i += 2
	}
	return b.String(), true
}

// metadataOf returns a sandbox's E2B metadata.
func metadataOf(labels map[string]string) map[string]string {
	md := map[string]string{}
	for k, v := range labels {
		if m, ok := strings.CutPrefix(k, MetadataPrefix); ok {
			if key, ok := unMetaKey(m); ok {
				md[key] = v
			}
		}
	}
	return md
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	var body newSandbox
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	req, err := s.createRequest(body)
	if err != nil {
		return err
	}
	ctx := r.Context()
	var sb api.Sandbox
	if ck, cerr := s.snapshotOf(ctx, body.TemplateID); cerr == nil {
		// A snapshot id: a fork of that checkpoint.
		res, err := s.sb.ForkCheckpoint(ctx, ck.ID, api.ForkRequest{Count: 1, Labels: req.Labels, Env: req.Env})
		if err != nil {
			return err
		}
		if len(res.Sandboxes) != 1 {
			return fmt.Errorf("forking snapshot %s: %d sandboxes: %w", ck.ID, len(res.Sandboxes), errdefs.ErrInternal)
		}
		sb = res.Sandboxes[0]
		if req.TimeoutSeconds > 0 {
			if sb, err = s.sb.SetTimeout(ctx, sb.ID, time.Duration(req.TimeoutSeconds)*time.Second); err != nil {
				return err
			}
		}
	} else if sb, err = s.sb.CreateSandbox(ctx, req); err != nil {
		return err
	}
	if err := s.prepareUser(ctx, sb.ID); err != nil {
		_ = s.sb.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		return err
	}
	writeJSON(w, http.StatusCreated, s.created(sb))
	return nil
}

// snapshotOf returns the checkpoint id names when it is one the caller
// sees (any checkpoint, not only those taken as E2B snapshots).
func (s *Server) snapshotOf(ctx context.Context, id string) (api.Checkpoint, error) {
	if id == "" {
		return api.Checkpoint{}, errdefs.ErrNotFound
	}
	return s.sb.GetCheckpoint(ctx, id)
}

// userScript makes the E2B user and its home when the template lacks
// them (idempotent), and gives templates without bash (busybox) a
// /bin/bash that runs sh, since E2B's SDK runs every command as
// "/bin/bash -l -c CMD".
const userScript = `set -e
if ! id ` + DefaultUser + ` >/dev/null 2>&1; then
  if command -v useradd >/dev/null 2>&1; then useradd -m -d ` + DefaultHome + ` -s /bin/bash ` + DefaultUser + ` 2>/dev/null || useradd -m -d ` + DefaultHome + ` ` + DefaultUser + `
  elif command -v adduser >/dev/null 2>&1; then adduser -D -h ` + DefaultHome + ` ` + DefaultUser + `
  else echo '` + DefaultUser + `:x:1000:1000:` + DefaultUser + `:` + DefaultHome + `:/bin/sh' >>/etc/passwd; echo '` + DefaultUser + `:x:1000:' >>/etc/group
  fi
fi
mkdir -p ` + DefaultHome + `
chown ` + DefaultUser + ` ` + DefaultHome + `
if [ ! -e /bin/bash ]; then printf '#!/bin/sh\nexec /bin/sh "$@"\n' >/bin/bash; chmod 755 /bin/bash; fi
`

// prepareUser runs userScript in a new sandbox as root, through the
// execute path like any command (it is a run of trigger e2b).
func (s *Server) prepareUser(ctx context.Context, id string) error {
	st, err := s.sb.Exec(ctx, id, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", userScript}, User: "root", Cwd: "/", TimeoutSeconds: 60})
	if err != nil {
		return fmt.Errorf("preparing user %s in sandbox %s: %w", DefaultUser, id, err)
	}
	defer st.Close()
	var out strings.Builder
	for {
		ev, err := st.Next()
		if err != nil {
			return fmt.Errorf("preparing user %s in sandbox %s: %w", DefaultUser, id, err)
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			if out.Len() < 4096 {
				out.Write(ev.Data)
			}
		case api.EventError:
			return fmt.Errorf("preparing user %s in sandbox %s: %s: %w", DefaultUser, id, ev.Error.Message, errdefs.ErrInternal)
		case api.EventExit:
			if ev.ExitCode == nil || *ev.ExitCode != 0 {
				return fmt.Errorf("preparing user %s in sandbox %s: the set-up script failed: %s: %w", DefaultUser, id, out.String(), errdefs.ErrFailedPrecondition)
			}
			return nil
		}
	}
}

// created is the create/connect/fork response for sb.
func (s *Server) created(sb api.Sandbox) sandboxCreated {
	return sandboxCreated{
		TemplateID:         templateOf(sb),
		SandboxID:          sb.ID,
		Alias:              sb.Name,
		ClientID:           "agentbox",
		EnvdVersion:        EnvdVersion,
		EnvdAccessToken:    s.tok.mint(tenant.Owner(sb.Tenant), sb.ID),
		TrafficAccessToken: s.tok.mintFor(purposeTraffic, tenant.Owner(sb.Tenant), sb.ID),
		Domain:             s.domain(),
	}
}

func (s *Server) domain() *string {
	if s.cfg.Domain == "" {
		return nil
	}
	d := s.cfg.Domain
	return &d
}

func templateOf(sb api.Sandbox) string {
	return cmp.Or(sb.Labels[LabelTemplate], sb.Template)
}

// stateOf is E2B's state: running or paused (hibernated too).
func stateOf(state string) string {
	switch state {
	case api.StatePaused, api.StateHibernated:
		return "paused"
	default:
		return state
	}
}

func (s *Server) detail(sb api.Sandbox, withToken bool) sandboxDetail {
	d := sandboxDetail{
		TemplateID:  templateOf(sb),
		Alias:       sb.Name,
		SandboxID:   sb.ID,
		ClientID:    "agentbox",
		StartedAt:   sb.CreatedAt,
		EndAt:       sb.CreatedAt.Add(DefaultTimeout),
		EnvdVersion: EnvdVersion,
		Domain:      s.domain(),
		CPUCount:    max(1, int(math.Ceil(sb.Resources.CPUs))),
		MemoryMB:    sb.Resources.MemoryBytes >> 20,
		DiskSizeMB:  sb.Resources.DiskBytes >> 20,
		Metadata:    metadataOf(sb.Labels),
		State:       stateOf(sb.State),
	}
	if sb.ExpiresAt != nil {
		d.EndAt = *sb.ExpiresAt
	}
	if withToken {
		d.EnvdAccessToken = s.tok.mint(tenant.Owner(sb.Tenant), sb.ID)
		d.TrafficAccessToken = s.tok.mintFor(purposeTraffic, tenant.Owner(sb.Tenant), sb.ID)
	}
	return d
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sb.GetSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.detail(sb, true))
	return nil
}

// listV1 is GET /sandboxes: the running sandboxes, no pagination.
func (s *Server) kill(w http.ResponseWriter, r *http.Request) error {
	if err := s.sb.DeleteSandbox(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var body timeoutBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	return s.extend(w, r, body.Timeout)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) error {
	var body refreshBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.Duration == 0 {
		body.Duration = int64(DefaultTimeout / time.Second)
	}
	return s.extend(w, r, body.Duration)
}

func (s *Server) extend(w http.ResponseWriter, r *http.Request, secs int64) error {
	if secs <= 0 {
		return fmt.Errorf("timeout %d: want a positive number of seconds: %w", secs, errdefs.ErrInvalidArgument)
	}
	if _, err := s.sb.SetTimeout(r.Context(), r.PathValue("id"), time.Duration(secs)*time.Second); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	sb, err := s.sb.GetSandbox(r.Context(), id)
	if err != nil {
		return err
	}
	if stateOf(sb.State) == "paused" {
		return fmt.Errorf("sandbox %s is already paused: %w", id, errdefs.ErrConflict)
	}
	if _, err := s.sb.PauseSandbox(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect resumes a paused sandbox (201) or returns a running one (200),
// with its timeout set when the body names one.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout int64 `json:"timeout"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	ctx, id := r.Context(), r.PathValue("id")
	sb, err := s.sb.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if sb.State != api.StateRunning {
		if sb, err = s.sb.ResumeSandbox(ctx, id); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	if body.Timeout > 0 && sb.Labels[LabelAutoPause] == "" {
		if sb, err = s.sb.SetTimeout(ctx, id, time.Duration(body.Timeout)*time.Second); err != nil {
			return err
		}
	}
	writeJSON(w, status, s.created(sb))
	return nil
}
