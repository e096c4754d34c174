package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Warm-pool benchmarks: a private daemon keeps a pool of paused sandboxes
// of the template; each timed create claims one (thaw, fresh machine-id
// written through the guest, record saved) and, in the second row, runs
// its first exec. Between runs (untimed) the sandbox is deleted and the
// pool refills.

const (
	keyPoolClaim     = "pool-claim"
	keyPoolClaimExec = "pool-claim-exec"
	groupPool        = "pool"
	poolBenchSize    = 2
)

func init() {
	groupOrder = append(groupOrder, groupPool)
	groupTitles[groupPool] = "Warm pool (paused sandboxes claimed by create)"
}

func measurePool(ctx context.Context, b *bench, bin, template string, buildTimeout time.Duration) []result {
	const (
		claimName = "agentbox: POST /v1/sandboxes served from the warm pool"
		execName  = "agentbox: POST /v1/sandboxes from the warm pool + exec /bin/true to exit event"
	)
	skipAll := func(why string) []result {
		return []result{skipped(keyPoolClaim, groupPool, claimName, why), skipped(keyPoolClaimExec, groupPool, execName, why)}
	}
	d, err := startDaemon(ctx, bin, "")
	if err != nil {
		return skipAll(err.Error())
	}
	defer d.stop()
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	err = d.buildTemplate(bctx, template)
	cancel()
	if err != nil {
		return skipAll("building template: " + err.Error())
	}
	resp, err := d.do(ctx, http.MethodPut, "/v1/templates/"+template+"/pool", api.PoolRequest{Size: poolBenchSize})
	if err == nil {
		err = drain(resp, http.StatusOK)
	}
	if err != nil {
		return skipAll("setting the pool: " + err.Error())
	}
	if err := d.waitPool(ctx, template, poolBenchSize); err != nil {
		return skipAll(err.Error())
	}
	note := fmt.Sprintf("pool of %d; the sandbox is deleted and the pool refilled between runs (untimed)", poolBenchSize)
	var out []result
	for _, m := range []struct {
		key, name string
		exec      bool
	}{{keyPoolClaim, claimName, false}, {keyPoolClaimExec, execName, true}} {
		var id string
		samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
			var err error
			if id, err = d.create(ctx, template); err != nil {
				return err
			}
			if m.exec {
				return d.exec(ctx, id, "/bin/true")
			}
			return nil
		}, func(int) error {
			if err := d.remove(ctx, id); err != nil {
				return err
			}
			return d.waitPool(ctx, template, poolBenchSize)
		})
		r := measured(m.key, groupPool, m.name, note, samples, err)
		if err == nil && d.claims(ctx, template) < int64(b.n+b.warmup) {
			r = skipped(m.key, groupPool, m.name, "creates were not served from the pool")
		}
		fmt.Fprintf(os.Stderr, "bench: %-20s %s\n", m.key, map[bool]string{true: "ok", false: "skipped: " + firstLine(r.Skip)}[r.Skip == ""])
		out = append(out, r)
	}
	return out
}

func (d *daemon) pool(ctx context.Context, template string) (api.Pool, error) {
	resp, err := d.do(ctx, http.MethodGet, "/v1/pools", nil)
	if err != nil {
		return api.Pool{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return api.Pool{}, statusError(resp)
	}
	var pl api.PoolList
	if err := json.NewDecoder(resp.Body).Decode(&pl); err != nil {
		return api.Pool{}, err
	}
	for _, p := range pl.Pools {
		if p.Template == template {
			return p, nil
		}
	}
	return api.Pool{}, fmt.Errorf("no pool for %s", template)
}

func (d *daemon) claims(ctx context.Context, template string) int64 {
	p, _ := d.pool(ctx, template)
	return p.Claims
}

// waitPool waits until template's pool has ready sandboxes.
func (d *daemon) waitPool(ctx context.Context, template string, ready int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := d.pool(ctx, template)
		if err != nil {
			return err
		}
		if p.Ready >= ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool of %s not refilled after 1m: %+v", template, p)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// poolTargets is the target for the warm-pool claim.
func poolTargets(results []result) []ratioLine {
	l := ratioLine{ratio: ratio{Label: "warm pool claim p50 (ms)", Target: 2, Max: true}}
	l.Status = "not measured"
	for _, r := range results {
		if r.Key == keyPoolClaim && r.Skip == "" && r.N > 0 {
			l.Value = float64(r.Median) / float64(time.Millisecond)
			l.Status = status(l.Value <= l.Target)
		}
	}
	return []ratioLine{l}
}
