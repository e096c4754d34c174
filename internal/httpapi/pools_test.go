package httpapi

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The fake service implements the optional pool interface, so its routes
// are registered (and checked against the spec) in every test.
var _ PoolService = (*fakeService)(nil)

func (f *fakeService) SetPool(ctx context.Context, name, runtime string, size int) (api.Pool, error) {
	if err := f.call("SetPool", name, runtime, size); err != nil {
		return api.Pool{}, err
	}
	if runtime == "" {
		runtime = "native"
	}
	return api.Pool{Template: name, Runtime: runtime, Size: size}, nil
}

func (f *fakeService) Pools(ctx context.Context) ([]api.Pool, error) {
	if err := f.call("Pools"); err != nil {
		return nil, err
	}
	return []api.Pool{{Template: "busybox", Runtime: "native", Size: 2, Ready: 1}, {Template: "busybox", Runtime: "gvisor", Size: 1}}, nil
}

func TestPoolRoutes(t *testing.T) {
	cases := []routeCase{
		{"PUT", "/v1/templates/busybox/pool", `{"size":3}`, nil, 200, "SetPool", []any{"busybox", "", 3}},
		{"PUT", "/v1/templates/busybox/pool", `{"size":3,"runtime":"gvisor"}`, nil, 200, "SetPool", []any{"busybox", "gvisor", 3}},
		{"PUT", "/v1/templates/busybox/pool", `{"size":1,"runtime":"nope"}`, errdefs.ErrInvalidArgument, 400, "SetPool", nil},
		{"PUT", "/v1/templates/busybox/pool", `{"size":1,"runtime":"gvisor"}`, errdefs.ErrFailedPrecondition, 412, "SetPool", nil},
		{"PUT", "/v1/templates/busybox/pool", `{"size":3,"extra":1}`, nil, 400, "", nil},
		{"PUT", "/v1/templates/busybox/pool", `{"size":"x"}`, nil, 400, "", nil},
		{"PUT", "/v1/templates/nope/pool", `{"size":1}`, errdefs.ErrNotFound, 404, "SetPool", nil},
		{"PUT", "/v1/templates/busybox/pool", `{"size":999}`, errdefs.ErrInvalidArgument, 400, "SetPool", nil},
		{"GET", "/v1/pools", ``, nil, 200, "Pools", nil},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+tc.body, func(t *testing.T) {
			_, rec, called := tc.serve(t)
			if !called {
				return
			}
			if tc.status == 200 && tc.path == "/v1/pools" {
				var pl api.PoolList
				if err := json.Unmarshal(rec.Body.Bytes(), &pl); err != nil || len(pl.Pools) != 2 || pl.Pools[0].Ready != 1 || pl.Pools[1].Runtime != "gvisor" {
					t.Fatalf("body %q: %v", rec.Body, err)
				}
			}
		})
	}
}
