package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime/gvisor"
)

// Memory checkpoints on gvisor (docs/GVISOR.md): a python3 process
// holding a 50 MB object and a counter, in a sandbox of the debian
// template; timed are the memory checkpoint (POST .../checkpoints with
// memory: true, to its response), the restore in place from it, and a
// fork ×10 of it (all ten answering).

const (
	keyGvMemCkpt    = "agentbox-gvisor-memory-checkpoint"
	keyGvMemRestore = "agentbox-gvisor-memory-restore"
	keyGvMemFork10  = "agentbox-gvisor-memory-fork10"
	// memTemplate has python3 (built by mmdebstrap on first use).
	memTemplate = "debian"
	memForks    = 10
)

// memCounter starts the 50 MB counter in the background.
const memCounter = `nohup python3 -c '
import os, time
blob = bytearray(os.urandom(1 << 20)) * 50
n = 0
while True:
    n += 1
    open("/tmp/n", "w").write(str(n))
    time.sleep(0.05)
' >/dev/null 2>&1 &
while [ ! -s /tmp/n ]; do sleep 0.1; done`

func init() {
	ratios = append(ratios,
		ratio{Label: "agentbox gvisor fork ×10 from a memory checkpoint vs one restore", Num: keyGvMemFork10, Den: keyGvMemRestore, Target: 3, Max: true},
	)
}

func measureGvisorMemory(ctx context.Context, b *bench, bin string, buildTimeout time.Duration) []result {
	const (
		ckptName    = "agentbox gvisor: memory checkpoint of a python3 process holding 50 MB (target ≤ 200 ms)"
		restoreName = "agentbox gvisor: restore in place from that memory checkpoint, to the response (target ≤ 300 ms)"
		forkName    = "agentbox gvisor: fork ×10 from that memory checkpoint, all answering (target ≤ 3× one restore)"
	)
	skipAll := func(why string) []result {
		return []result{skipped(keyGvMemCkpt, groupGvisor, ckptName, why), skipped(keyGvMemRestore, groupGvisor, restoreName, why), skipped(keyGvMemFork10, groupGvisor, forkName, why)}
	}
	if _, err := gvisor.FindRunsc(""); err != nil {
		return skipAll(err.Error())
	}
	d, err := startDaemon(ctx, bin, "")
	if err != nil {
		return skipAll(err.Error())
	}
	defer d.stop()
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	err = d.buildTemplate(bctx, memTemplate)
	cancel()
	if err != nil {
		return skipAll("building template " + memTemplate + ": " + err.Error())
	}
	id, err := d.createOn(ctx, memTemplate, gvisor.Name)
	if err != nil {
		return skipAll(err.Error())
	}
	defer func() { _ = d.remove(ctx, id) }()
	if err := d.exec(ctx, id, "sh", "-c", memCounter); err != nil {
		return skipAll("starting the python3 counter: " + err.Error())
	}
	var ckpts []string
	defer func() {
		for _, c := range ckpts {
			_ = d.deleteCheckpoint(ctx, c)
		}
	}()
	ckSamples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		c, err := d.memoryCheckpoint(ctx, id)
		if err == nil {
			ckpts = append(ckpts, c)
		}
		return err
	}, nil)
	ckRow := measured(keyGvMemCkpt, groupGvisor, ckptName, "POST /v1/sandboxes/{id}/checkpoints {memory: true} to its response; the sandbox runs on; gVisor "+gvisor.PinnedVersion, ckSamples, err)
	if len(ckpts) == 0 {
		return append([]result{ckRow}, skipped(keyGvMemRestore, groupGvisor, restoreName, "no checkpoint"), skipped(keyGvMemFork10, groupGvisor, forkName, "no checkpoint"))
	}
	ck := ckpts[len(ckpts)-1]
	rsSamples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		resp, err := d.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/restore", api.RestoreRequest{Checkpoint: ck})
		if err != nil {
			return err
		}
		return drain(resp, http.StatusOK)
	}, nil)
	rsRow := measured(keyGvMemRestore, groupGvisor, restoreName, "POST /v1/sandboxes/{id}/restore to its response: guest stopped, runsc restore, guest sockets claimed and proved", rsSamples, err)
	var forks []string
	fkSamples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		resp, err := d.do(ctx, http.MethodPost, "/v1/checkpoints/"+ck+"/fork", api.ForkRequest{Count: memForks, Labels: map[string]string{benchLabel: "1"}})
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return statusError(resp)
		}
		var res api.ForkResult
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			return err
		}
		for _, sb := range res.Sandboxes {
			forks = append(forks, sb.ID)
		}
		if len(res.Sandboxes) != memForks {
			return fmt.Errorf("fork made %d sandboxes, want %d", len(res.Sandboxes), memForks)
		}
		return nil
	}, func(int) error {
		for _, f := range forks {
			_ = d.remove(ctx, f)
		}
		forks = nil
		return nil
	})
	fkRow := measured(keyGvMemFork10, groupGvisor, forkName, fmt.Sprintf("POST /v1/checkpoints/{cid}/fork count %d to its response (each fork's guest proved); DELETEs not timed; the daemon starts 4 at a time", memForks), fkSamples, err)
	return []result{ckRow, rsRow, fkRow}
}

// memoryCheckpoint takes a memory checkpoint of sandbox id.
func (d *daemon) memoryCheckpoint(ctx context.Context, id string) (string, error) {
	resp, err := d.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/checkpoints", api.CreateCheckpointRequest{Memory: true})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", statusError(resp)
	}
	var ck api.Checkpoint
	if err := json.NewDecoder(resp.Body).Decode(&ck); err != nil {
		return "", err
	}
	return ck.ID, nil
}

func (d *daemon) deleteCheckpoint(ctx context.Context, cid string) error {
	resp, err := d.do(context.WithoutCancel(ctx), http.MethodDelete, "/v1/checkpoints/"+cid, nil)
	if err != nil {
		return err
	}
	return drain(resp, http.StatusNoContent)
}
