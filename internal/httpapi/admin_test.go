package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

func (f *fakeService) Quarantine(ctx context.Context) ([]api.QuarantinedRecord, error) {
	if err := f.call("Quarantine"); err != nil {
		return nil, err
	}
	return []api.QuarantinedRecord{{Bucket: "sandboxes", Key: "abc", Reason: "undecodable", Raw: []byte("{"), At: time.Unix(0, 0).UTC()}}, nil
}

func TestQuarantineRoute(t *testing.T) {
	f := &fakeService{}
	rec := httptest.NewRecorder()
	New(f, Options{}).ServeHTTP(rec, httptest.NewRequest("GET", "/v1/admin/quarantine", nil))
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var got []api.QuarantinedRecord
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Key != "abc" || string(got[0].Raw) != "{" {
		t.Fatalf("got %+v", got)
	}
	f = &fakeService{err: fmt.Errorf("store closed: %w", errdefs.ErrUnavailable)}
	rec = httptest.NewRecorder()
	New(f, Options{}).ServeHTTP(rec, httptest.NewRequest("GET", "/v1/admin/quarantine", nil))
	if rec.Code != 503 {
		t.Fatalf("status %d on an unavailable store, want 503", rec.Code)
	}
}
