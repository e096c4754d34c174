package httpapi

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The fake service implements the optional pool interface, so its routes
// are registered (and checked against the spec) in every test.
var _ PoolService = (*fakeService)(nil)

func (f *fakeService) SetPool(ctx context.Context, name string, size int) (api.Pool, error) {
	if err := f.call("SetPool", name, size); err != nil {
		return api.Pool{}, err
	}
	return api.Pool{Template: name, Size: size}, nil
}

func (f *fakeService) Pools(ctx context.Context) ([]api.Pool, error) {
	if err := f.call("Pools"); err != nil {
		return nil, err
	}
	return []api.Pool{{Template: "busybox", Size: 2, Ready: 1}}, nil
}

func TestPoolRoutes(t *testing.T) {
	cases := []struct {
		method, path, body string
		err                error
		status             int
		call               string
		args               []any
	}{
		{"PUT", "/v1/templates/busybox/pool", `{"size":3}`, nil, 200, "SetPool", []any{"busybox", 3}},
		{"PUT", "/v1/templates/busybox/pool", `{"size":3,"extra":1}`, nil, 400, "", nil},
		{"PUT", "/v1/templates/busybox/pool", `{"size":"x"}`, nil, 400, "", nil},
		{"PUT", "/v1/templates/nope/pool", `{"size":1}`, errdefs.ErrNotFound, 404, "SetPool", nil},
		{"PUT", "/v1/templates/busybox/pool", `{"size":999}`, errdefs.ErrInvalidArgument, 400, "SetPool", nil},
		{"GET", "/v1/pools", ``, nil, 200, "Pools", nil},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+tc.body, func(t *testing.T) {
			f := &fakeService{err: tc.err}
			h := New(f, Options{})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.call == "" {
				if len(f.calls) != 0 {
					t.Fatalf("service called on invalid input: %v", f.calls)
				}
				return
			}
			if len(f.calls) != 1 || f.calls[0] != tc.call {
				t.Fatalf("calls %v, want %s", f.calls, tc.call)
			}
			if tc.args != nil && !reflect.DeepEqual(f.lastArgs, tc.args) {
				t.Fatalf("args %#v, want %#v", f.lastArgs, tc.args)
			}
			if tc.status == 200 && tc.path == "/v1/pools" {
				var pl api.PoolList
				if err := json.Unmarshal(rec.Body.Bytes(), &pl); err != nil || len(pl.Pools) != 1 || pl.Pools[0].Ready != 1 {
					t.Fatalf("body %q: %v", rec.Body, err)
				}
			}
		})
	}
}
