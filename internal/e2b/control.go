package e2b

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
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
		TemplateID:      templateOf(sb),
		SandboxID:       sb.ID,
		Alias:           sb.Name,
		ClientID:        "agentbox",
		EnvdVersion:     EnvdVersion,
		EnvdAccessToken: s.tok.mint(tenant.Owner(sb.Tenant), sb.ID),
		Domain:          s.domain(),
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
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	q.Set("state", "running")
	q.Del("limit")
	q.Del("nextToken")
	page, _, err := s.listPage(r.Context(), q)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	page, next, err := s.listPage(r.Context(), r.URL.Query())
	if err != nil {
		return err
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// listQuery is the parsed query of GET /v2/sandboxes.
type listQuery struct {
	labels map[string]string
	states map[string]bool // nil: all
	limit  int             // 0: all
	after  *pageToken
}

// parseListQuery parses metadata (a URL-encoded k=v&... string, each key
// and value encoded once more), state (comma-separated or repeated),
// limit and nextToken.
func parseListQuery(q url.Values) (listQuery, error) {
	var lq listQuery
	if md := q.Get("metadata"); md != "" {
		pairs, err := url.ParseQuery(md)
		if err != nil {
			return lq, fmt.Errorf("metadata %q: %w: %w", md, err, errdefs.ErrInvalidArgument)
		}
		m := map[string]string{}
		for k, vs := range pairs {
			kk, err1 := url.QueryUnescape(k)
			vv, err2 := url.QueryUnescape(vs[len(vs)-1])
			if err1 != nil || err2 != nil {
				return lq, fmt.Errorf("metadata %q: bad encoding: %w", md, errdefs.ErrInvalidArgument)
			}
			m[kk] = vv
		}
		labels, err := metadataLabels(m)
		if err != nil {
			return lq, err
		}
		lq.labels = labels
	}
	for _, v := range q["state"] {
		for st := range strings.SplitSeq(v, ",") {
			switch st = strings.TrimSpace(st); st {
			case "running", "paused":
				if lq.states == nil {
					lq.states = map[string]bool{}
				}
				lq.states[st] = true
			case "":
			default:
				return lq, fmt.Errorf("state %q: want running or paused: %w", st, errdefs.ErrInvalidArgument)
			}
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return lq, fmt.Errorf("limit %q: want 1 to 1000: %w", v, errdefs.ErrInvalidArgument)
		}
		lq.limit = n
	}
	if v := q.Get("nextToken"); v != "" {
		t, err := parsePageToken(v)
		if err != nil {
			return lq, err
		}
		lq.after = &t
	}
	return lq, nil
}

// pageToken is where a page ends: the list is ordered newest first, then
// by id.
type pageToken struct {
	created time.Time
	id      string
}

func (t pageToken) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(t.created.UnixNano(), 10) + "/" + t.id))
}

func parsePageToken(s string) (pageToken, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		ns, id, ok := strings.Cut(string(b), "/")
		n, perr := strconv.ParseInt(ns, 10, 64)
		if ok && perr == nil && id != "" {
			return pageToken{created: time.Unix(0, n).UTC(), id: id}, nil
		}
	}
	return pageToken{}, fmt.Errorf("nextToken %q is not valid: %w", s, errdefs.ErrInvalidArgument)
}

// comparePage orders newest first, then by id.
func comparePage(aCreated time.Time, aID string, b pageToken) int {
	if c := b.created.Compare(aCreated); c != 0 {
		return c
	}
	return strings.Compare(aID, b.id)
}

func (s *Server) listPage(ctx context.Context, q url.Values) ([]sandboxDetail, string, error) {
	lq, err := parseListQuery(q)
	if err != nil {
		return nil, "", err
	}
	sbs, err := s.sb.ListSandboxes(ctx, lq.labels)
	if err != nil {
		return nil, "", err
	}
	slices.SortFunc(sbs, func(a, b api.Sandbox) int {
		return comparePage(a.CreatedAt, a.ID, pageToken{created: b.CreatedAt, id: b.ID})
	})
	out := []sandboxDetail{}
	next := ""
	for _, sb := range sbs {
		st := stateOf(sb.State)
		if st != "running" && st != "paused" {
			continue
		}
		if lq.states != nil && !lq.states[st] {
			continue
		}
		if lq.after != nil && comparePage(sb.CreatedAt, sb.ID, *lq.after) <= 0 {
			continue
		}
		if lq.limit > 0 && len(out) == lq.limit {
			last := out[len(out)-1]
			next = pageToken{created: last.StartedAt, id: last.SandboxID}.String()
			break
		}
		out = append(out, s.detail(sb, false))
	}
	return out, next, nil
}

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

func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	var body forkBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	ctx := r.Context()
	res, err := s.sb.ForkSandbox(ctx, r.PathValue("id"), api.ForkRequest{Count: max(body.Count, 1)})
	if err != nil {
		return err
	}
	timeout := DefaultTimeout
	if body.Timeout != nil && *body.Timeout > 0 {
		timeout = time.Duration(*body.Timeout) * time.Second
	}
	out := []forkResult{}
	for _, sb := range res.Sandboxes {
		if sb.Labels[LabelAutoPause] == "" {
			if t, err := s.sb.SetTimeout(ctx, sb.ID, timeout); err != nil {
				st := statusOf(err)
				out = append(out, forkResult{Error: &apiError{Code: st, Message: publicMessage(err, st)}})
				continue
			} else {
				sb = t
			}
		}
		c := s.created(sb)
		out = append(out, forkResult{Sandbox: &c})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body snapshotBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	ck, err := s.sb.CreateCheckpoint(r.Context(), r.PathValue("id"), api.CreateCheckpointRequest{Name: body.Name, Labels: map[string]string{LabelSnapshot: "true"}})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotOf(ck))
	return nil
}

func snapshotOf(ck api.Checkpoint) snapshotInfo {
	si := snapshotInfo{SnapshotID: ck.ID, Names: []string{}}
	if ck.Name != "" {
		si.Names = append(si.Names, ck.Name)
	}
	return si
}

// listSnapshots lists the caller's E2B snapshots (checkpoints taken
// through this front end), newest first, optionally of one sandbox.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	cks, err := s.sb.ListCheckpoints(r.Context(), q.Get("sandboxID"))
	if err != nil {
		return err
	}
	var after *pageToken
	if v := q.Get("nextToken"); v != "" {
		t, err := parsePageToken(v)
		if err != nil {
			return err
		}
		after = &t
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 {
			return fmt.Errorf("limit %q: want a positive number: %w", v, errdefs.ErrInvalidArgument)
		}
	}
	slices.SortFunc(cks, func(a, b api.Checkpoint) int {
		return comparePage(a.CreatedAt, a.ID, pageToken{created: b.CreatedAt, id: b.ID})
	})
	out := []snapshotInfo{}
	var last api.Checkpoint
	for _, ck := range cks {
		if ck.Labels[LabelSnapshot] == "" || (q.Get("name") != "" && ck.Name != q.Get("name")) {
			continue
		}
		if after != nil && comparePage(ck.CreatedAt, ck.ID, *after) <= 0 {
			continue
		}
		if limit > 0 && len(out) == limit {
			w.Header().Set("X-Next-Token", pageToken{created: last.CreatedAt, id: last.ID}.String())
			break
		}
		out = append(out, snapshotOf(ck))
		last = ck
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteSnapshot is DELETE /templates/{id}: E2B deletes snapshots as
// templates; only snapshots are served here (another id is not found).
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	ctx, id := r.Context(), r.PathValue("id")
	ck, err := s.sb.GetCheckpoint(ctx, id)
	if err != nil {
		return err
	}
	if ck.Labels[LabelSnapshot] == "" {
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	if err := s.sb.DeleteCheckpoint(ctx, ck.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// metricSample is how long metrics measures CPU use over.
const metricSample = 200 * time.Millisecond

// metrics answers one sample measured now: agentbox keeps no history of
// a sandbox's counters.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	ctx, id := r.Context(), r.PathValue("id")
	sb, err := s.sb.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	m := sandboxMetric{CPUCount: max(1, int(math.Ceil(sb.Resources.CPUs))), MemTotal: sb.Resources.MemoryBytes, DiskTotal: sb.Resources.DiskBytes}
	if sb.State == api.StateRunning {
		a, err := s.sb.SandboxStats(ctx, id)
		if err != nil {
			return err
		}
		t := time.NewTimer(metricSample)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		b, err := s.sb.SandboxStats(ctx, id)
		if err != nil {
			return err
		}
		m.MemUsed = b.MemoryBytes
		m.CPUUsedPct = 100 * float64(b.CPUTime-a.CPUTime) / float64(metricSample) / float64(m.CPUCount)
	}
	if sb.Disk != nil {
		m.DiskUsed = sb.Disk.UsedBytes
		if m.DiskTotal == 0 {
			m.DiskTotal = sb.Disk.TotalBytes
		}
	}
	now := time.Now().UTC()
	m.Timestamp, m.TimestampUnix = now, now.Unix()
	writeJSON(w, http.StatusOK, []sandboxMetric{m})
	return nil
}
