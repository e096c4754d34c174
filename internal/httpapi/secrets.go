package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/strictjson"
)

// SecretService is implemented by a Service with a secret store; its routes
// exist only then. Values are write-only: no method returns one. The
// contract of Service applies; names match secretNameRe.
type SecretService interface {
	// PutSecret stores value under name, replacing an earlier value.
	PutSecret(ctx context.Context, name string, value []byte) (api.SecretInfo, error)
	// ListSecrets returns every secret's name and times, ordered by name.
	ListSecrets(ctx context.Context) ([]api.SecretInfo, error)
	// DeleteSecret removes a secret (ErrNotFound when missing).
	DeleteSecret(ctx context.Context, name string) error
}

// EventService is implemented by a Service that records the events programs
// inside sandboxes send through the API bridge.
type EventService interface {
	// SandboxEvents returns the recorded events of sandbox id, oldest
	// first (a bounded, newest-kept buffer).
	SandboxEvents(ctx context.Context, id string) ([]api.SandboxEvent, error)
}

// WatchService is implemented by a Service that can watch a sandbox's
// directory (GET /v1/sandboxes/{id}/fs/watch).
type WatchService interface {
	// WatchDir streams the changes under directory path (recursive: its
	// subdirectories too) until ctx is done or the stream is closed. It
	// returns once the directory is watched: a change made after it
	// returns is reported.
	WatchDir(ctx context.Context, id, path string, recursive bool) (FSEvents, error)
}

// FSEvents is a stream of file system events. Next blocks until an event,
// the end (io.EOF) or an error; Close (from any goroutine) ends it.
type FSEvents interface {
	Next() (api.FSEvent, error)
	Close() error
}

// maxSecretBody bounds a PUT /v1/secrets body (the service enforces the
// exact value limit).
const maxSecretBody = 256 << 10

// secretNameRe is a secret name, optionally qualified by its tenant
// ("tenant~name", meaningful to the admin only).
var secretNameRe = lazyregexp.New(`^([a-z0-9][a-z0-9-]{0,31}~)?[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// secretRoutes are the routes of SecretService and EventService, for those
// svc implements.
func (h *handler) secretRoutes() []route {
	var rts []route
	if ss, ok := h.svc.(SecretService); ok {
		s := secretHandlers{h: h, svc: ss}
		rts = append(rts,
			route{"GET", "/v1/secrets", listAll(ss.ListSecrets, func(l []api.SecretInfo) api.SecretList { return api.SecretList{Secrets: l} })},
			route{"PUT", "/v1/secrets/{name}", s.put},
			route{"DELETE", "/v1/secrets/{name}", s.delete},
		)
	}
	if ws, ok := h.svc.(WatchService); ok {
		rts = append(rts, route{"GET", "/v1/sandboxes/{id}/fs/watch", func(w http.ResponseWriter, r *http.Request) error {
			return h.watch(ws, w, r)
		}})
	}
	if _, audit := h.svc.(AuditService); audit {
		// The flight recorder serves the route (auditRoutes).
	} else if es, ok := h.svc.(EventService); ok {
		rts = append(rts, route{"GET", "/v1/sandboxes/{id}/events", func(w http.ResponseWriter, r *http.Request) error {
			id, err := sandboxID(r)
			if err != nil {
				return err
			}
			evs, err := es.SandboxEvents(r.Context(), id)
			if err != nil {
				return err
			}
			if evs == nil {
				evs = []api.SandboxEvent{}
			}
			writeJSON(w, http.StatusOK, api.SandboxEventList{Events: evs})
			return nil
		}})
	}
	return rts
}

type secretHandlers struct {
	h   *handler
	svc SecretService
}

func secretName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if !secretNameRe.MatchString(name) {
		return "", errorf("invalid secret name %q (letters, digits, '_', '.', '-'; at most 128)", clip(name))
	}
	return name, nil
}

// put takes the value as the raw body, or as {"value": "..."} when the
// content type is JSON. The value is never logged or echoed.
func (s secretHandlers) put(w http.ResponseWriter, r *http.Request) error {
	name, err := secretName(r)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSecretBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("secret value larger than %d bytes: %w", mbe.Limit, err)
		}
		return errorf("reading the secret value failed")
	}
	value := body
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/json" {
		var req api.PutSecretRequest
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || dec.More() || strictjson.CheckDuplicates(body, reflect.TypeOf(req)) != nil {
			return errorf("body must be {\"value\": \"...\"} (once) with Content-Type application/json")
		}
		value = []byte(req.Value)
	}
	if len(value) == 0 {
		return errorf("secret value is empty")
	}
	info, err := s.svc.PutSecret(r.Context(), name, value)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (s secretHandlers) delete(w http.ResponseWriter, r *http.Request) error {
	name, err := secretName(r)
	if err != nil {
		return err
	}
	if err := s.svc.DeleteSecret(r.Context(), name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
