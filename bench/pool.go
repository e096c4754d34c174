package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime/gvisor"
)

// Warm-pool benchmarks: a private daemon keeps a pool of paused sandboxes
// of the template; each timed create claims one (thaw, record saved; the
// fresh identity was written when it was pooled) and, in the second row,
// runs its first exec. Between runs (untimed) the sandbox is deleted and
// the pool refilled. The same daemon, in the same run, then measures a
// pool on its gvisor backend the same way (thaw: runsc resume), when runsc
// is there and -gvisor is on; the native pool is emptied first, so its
// refills do not compete with the gvisor claims.

const (
	keyPoolClaim       = "pool-claim"
	keyPoolClaimExec   = "pool-claim-exec"
	keyGvPoolClaim     = "gvisor-pool-claim"
	keyGvPoolClaimExec = "gvisor-pool-claim-exec"
	groupPool          = "pool"
	poolBenchSize      = 2
	// poolRefillWait bounds a refill between runs: a gvisor sandbox's
	// start takes seconds on a loaded machine.
	poolRefillWait = 3 * time.Minute
)

func init() {
	groupOrder = append(groupOrder, groupPool)
	groupTitles[groupPool] = "Warm pool (paused sandboxes claimed by create)"
	ratios = append(ratios,
		ratio{Label: "agentbox gvisor warm-pool claim + first exec vs gvisor create→first exec", Num: keyGvPoolClaimExec, Den: keyGvCreate},
		ratio{Label: "agentbox gvisor warm-pool claim vs native warm-pool claim", Num: keyGvPoolClaim, Den: keyPoolClaim},
	)
}

// poolRow names one row of the warm-pool group.
type poolRow struct {
	key, name string
	exec      bool
}

// measurePool measures claims from a native pool and, with gv, from a
// gvisor pool, in one daemon.
func measurePool(ctx context.Context, b *bench, bin, template string, buildTimeout time.Duration, gv bool) []result {
	native := []poolRow{
		{keyPoolClaim, "agentbox: POST /v1/sandboxes served from the warm pool", false},
		{keyPoolClaimExec, "agentbox: POST /v1/sandboxes from the warm pool + exec /bin/true to exit event", true},
	}
	sentried := []poolRow{
		{keyGvPoolClaim, "agentbox gvisor: POST /v1/sandboxes (runtime gvisor) served from a gvisor warm pool", false},
		{keyGvPoolClaimExec, "agentbox gvisor: POST /v1/sandboxes (runtime gvisor) from a gvisor warm pool + exec /bin/true to exit event", true},
	}
	rows := native
	if gv {
		rows = append(rows, sentried...)
	}
	skipAll := func(rows []poolRow, why string) []result {
		var out []result
		for _, r := range rows {
			out = append(out, skipped(r.key, groupPool, r.name, why))
		}
		return out
	}
	d, err := startDaemon(ctx, bin, "")
	if err != nil {
		return skipAll(rows, err.Error())
	}
	defer d.stop()
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	err = d.buildTemplate(bctx, template)
	cancel()
	if err != nil {
		return skipAll(rows, "building template: "+err.Error())
	}
	out := d.measurePoolOn(ctx, b, template, "", "", native)
	if !gv {
		return out
	}
	if _, err := gvisor.FindRunsc(""); err != nil {
		return append(out, skipAll(sentried, err.Error())...)
	}
	if err := d.setPool(ctx, template, "", 0); err != nil {
		return append(out, skipAll(sentried, "emptying the native pool: "+err.Error())...)
	}
	return append(out, d.measurePoolOn(ctx, b, template, gvisor.Name, "runsc pause/resume; gVisor "+gvisor.PinnedVersion+"; ", sentried)...)
}

// measurePoolOn measures rows (a claim, a claim + first exec) from a pool
// of template on backend rt ("": the default), creates asking for rt.
func (d *daemon) measurePoolOn(ctx context.Context, b *bench, template, rt, note string, rows []poolRow) []result {
	var out []result
	if err := d.setPool(ctx, template, rt, poolBenchSize); err != nil {
		for _, r := range rows {
			out = append(out, skipped(r.key, groupPool, r.name, "setting the pool: "+err.Error()))
		}
		return out
	}
	note += fmt.Sprintf("pool of %d; the sandbox is deleted and the pool refilled between runs (untimed)", poolBenchSize)
	for _, m := range rows {
		var id string
		before := d.claims(ctx, template, rt)
		err := d.waitPool(ctx, template, rt, poolBenchSize)
		var samples []time.Duration
		if err == nil {
			samples, err = timeN(ctx, b.n, b.warmup, func(int) error {
				var err error
				if id, err = d.createOn(ctx, template, rt); err != nil {
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
				return d.waitPool(ctx, template, rt, poolBenchSize)
			})
		}
		r := measured(m.key, groupPool, m.name, note, samples, err)
		if err == nil && d.claims(ctx, template, rt)-before < int64(b.n+b.warmup) {
			r = skipped(m.key, groupPool, m.name, "creates were not served from the pool")
		}
		if err != nil {
			r.Skip += d.logTail()
		}
		fmt.Fprintf(os.Stderr, "bench: %-24s %s\n", m.key, map[bool]string{true: "ok", false: "skipped: " + firstLine(r.Skip)}[r.Skip == ""])
		out = append(out, r)
	}
	return out
}

// setPool sets template's pool on backend rt ("": the default) to size.
func (d *daemon) setPool(ctx context.Context, template, rt string, size int) error {
	resp, err := d.do(ctx, http.MethodPut, "/v1/templates/"+template+"/pool", api.PoolRequest{Size: size, Runtime: rt})
	if err != nil {
		return err
	}
	return drain(resp, http.StatusOK)
}

// pool is the state of template's pool on backend rt ("": the only pool of
// template, as on a daemon with one backend).
func (d *daemon) pool(ctx context.Context, template, rt string) (api.Pool, error) {
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
		if p.Template == template && (rt == "" && p.Size > 0 || p.Runtime == rt) {
			return p, nil
		}
	}
	return api.Pool{}, fmt.Errorf("no pool for %s on %q", template, rt)
}

func (d *daemon) claims(ctx context.Context, template, rt string) int64 {
	p, _ := d.pool(ctx, template, rt)
	return p.Claims
}

// waitPool waits until template's pool on rt has ready sandboxes.
func (d *daemon) waitPool(ctx context.Context, template, rt string, ready int) error {
	deadline := time.Now().Add(poolRefillWait)
	for {
		p, err := d.pool(ctx, template, rt)
		if err != nil {
			return err
		}
		if p.Ready >= ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool of %s on %q not refilled after %s: %+v", template, rt, poolRefillWait, p)
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
