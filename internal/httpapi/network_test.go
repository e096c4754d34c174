package httpapi

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
)

// The fake service implements NetworkService, so its routes are registered
// (and checked against the spec) in every test.
var _ NetworkService = (*fakeService)(nil)

func (f *fakeService) UpdateNetwork(ctx context.Context, id string, spec api.NetworkSpec) (api.Sandbox, error) {
	if err := f.call("UpdateNetwork", id, spec); err != nil {
		return api.Sandbox{}, err
	}
	sb := sandbox(id)
	sb.Network = &spec
	return sb, nil
}

func (f *fakeService) EgressLog(ctx context.Context, id string, limit int) ([]api.EgressRecord, error) {
	if err := f.call("EgressLog", id, limit); err != nil {
		return nil, err
	}
	return []api.EgressRecord{{Time: t0, SandboxID: id, Kind: "connect", Destination: "a.test:443", Decision: api.EgressDenied}}, nil
}

func TestNetworkRoutes(t *testing.T) {
	f := &fakeService{}
	h := New(f, Options{})
	do := func(method, path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
		return w
	}
	w := do("PUT", "/v1/sandboxes/sb1/network", `{"mode":"egress","allow":["a.test"]}`)
	if w.Code != 200 {
		t.Fatalf("put network: %d %s", w.Code, w.Body)
	}
	if _, args := f.lastCall(); args[0] != "sb1" || args[1].(api.NetworkSpec).Allow[0] != "a.test" {
		t.Fatalf("args %v", args)
	}
	for _, body := range []string{``, `{"mode":"egress","bogus":1}`, `[]`} {
		if w := do("PUT", "/v1/sandboxes/sb1/network", body); w.Code != 400 {
			t.Errorf("body %q: %d", body, w.Code)
		}
	}
	w = do("GET", "/v1/sandboxes/sb1/egress?limit=5", "")
	var log api.EgressLog
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &log) != nil || len(log.Records) != 1 {
		t.Fatalf("egress log: %d %s", w.Code, w.Body)
	}
	if _, args := f.lastCall(); args[1] != 5 {
		t.Fatalf("limit not passed: %v", args)
	}
	if w := do("GET", "/v1/sandboxes/sb1/egress?limit=-1", ""); w.Code != 400 {
		t.Fatalf("negative limit: %d", w.Code)
	}
}
