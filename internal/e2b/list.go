package e2b

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Listing sandboxes: GET /sandboxes and /v2/sandboxes with metadata and
// state filters and token pagination.

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
