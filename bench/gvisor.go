package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime/gvisor"
)

// gVisor benchmarks: `runsc run` of /bin/true in the peers' busybox bundle
// (runsc invoked directly, as a user of gVisor would), and agentbox's
// create→first exec and exec round trip on its gvisor backend, in one
// private daemon.

const (
	keyRunscRun = "runsc-run"
	keyGvCreate = "agentbox-gvisor-create"
	keyGvExec   = "agentbox-gvisor-exec"
	groupGvisor = "gvisor"
)

func init() {
	groupOrder = append(groupOrder, groupGvisor)
	groupTitles[groupGvisor] = "gVisor (runsc, systrap platform)"
	ratios = append(ratios,
		ratio{Label: "agentbox gvisor create→first exec vs runsc run true", Num: keyGvCreate, Den: keyRunscRun, Target: 1.0 / 3, Max: true},
		ratio{Label: "agentbox gvisor create→first exec vs native create→first exec", Num: keyGvCreate, Den: keyABCreate},
		ratio{Label: "agentbox gvisor exec round trip vs native exec round trip", Num: keyGvExec, Den: keyABExec},
	)
}

func measureGvisor(ctx context.Context, b *bench, tmp, bin, template string, buildTimeout time.Duration) []result {
	const (
		runName    = "runsc run (busybox bundle, /bin/true)"
		createName = "agentbox gvisor: POST /v1/sandboxes (runtime gvisor) + exec /bin/true to exit event"
		execName   = "agentbox gvisor: exec /bin/true round trip (NDJSON to exit event)"
	)
	runsc, err := gvisor.FindRunsc("")
	if err != nil {
		why := err.Error()
		return []result{skipped(keyRunscRun, groupGvisor, runName, why), skipped(keyGvCreate, groupGvisor, createName, why), skipped(keyGvExec, groupGvisor, execName, why)}
	}
	out := []result{measureRunscRun(ctx, b, tmp, runsc, runName)}

	skipAB := func(why string) []result {
		return append(out, skipped(keyGvCreate, groupGvisor, createName, why), skipped(keyGvExec, groupGvisor, execName, why))
	}
	d, err := startDaemon(ctx, bin, "")
	if err != nil {
		return skipAB(err.Error())
	}
	defer d.stop()
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	err = d.buildTemplate(bctx, template)
	cancel()
	if err != nil {
		return skipAB("building template: " + err.Error())
	}
	ids := make([]string, b.warmup+b.n)
	timed := map[string]bool{}
	samples, err := timeN(ctx, b.n, b.warmup, func(i int) error {
		id, err := d.createOn(ctx, template, gvisor.Name)
		if err != nil {
			return err
		}
		ids[i] = id
		if i >= b.warmup {
			timed[id] = true
		}
		return d.exec(ctx, id, "/bin/true")
	}, func(i int) error {
		if ids[i] == "" {
			return nil
		}
		err := d.remove(ctx, ids[i])
		ids[i] = ""
		return err
	})
	for _, id := range ids {
		if id != "" {
			_ = d.remove(ctx, id)
		}
	}
	create := measured(keyGvCreate, groupGvisor, createName, "create→first exec completed; DELETE not timed; unix socket, keep-alive; gVisor "+gvisor.PinnedVersion, samples, err)
	if err != nil {
		create.Skip += d.logTail()
	}
	createParts := measureGvisorCreateParts(d.logPath, timed)
	execRows := func() []result {
		id, err := d.createOn(ctx, template, gvisor.Name)
		if err != nil {
			return []result{skipped(keyGvExec, groupGvisor, execName, err.Error())}
		}
		defer func() { _ = d.remove(ctx, id) }()
		samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
			return d.exec(ctx, id, "/bin/true")
		}, nil)
		rows := []result{measured(keyGvExec, groupGvisor, execName, "one running sandbox; the guest's socket through the sentry (--host-uds), not runsc exec; target ≤ 3 ms", samples, err)}
		// Its parts, and the native peers of two of them (same daemon).
		nativeID, err := d.createOn(ctx, template, "")
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: native sandbox for the spawn peers:", err)
			nativeID = ""
		} else {
			defer func() { _ = d.remove(ctx, nativeID) }()
		}
		return append(rows, measureGvisorExecParts(ctx, b, d, id, nativeID)...)
	}()
	return append(append(append(out, create), createParts...), execRows...)
}

// measureRunscRun times `runsc run` of /bin/true in the peers' bundle,
// with the backend's flags (systrap, no network), in a root of its own.
func measureRunscRun(ctx context.Context, b *bench, tmp, runsc, name string) result {
	root := filepath.Join(tmp, "runsc-root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return skipped(keyRunscRun, groupGvisor, name, err.Error())
	}
	defer func() {
		// runsc's empty network namespace for gofers, one per root.
		_ = exec.Command("umount", "-l", filepath.Join(root, "null-netns")).Run()
	}()
	flags := []string{"--root=" + root, "--platform=systrap", "--network=none"}
	samples, err := timeN(ctx, b.n, b.warmup, func(i int) error {
		cmd := exec.CommandContext(ctx, runsc, append(flags, "run", "--bundle", b.bundle, b.id("runsc", i))...)
		return runCmd(cmd)
	}, func(i int) error {
		_ = exec.Command(runsc, append(flags, "delete", "--force", b.id("runsc", i))...).Run()
		return nil
	})
	return measured(keyRunscRun, groupGvisor, name, "gVisor "+gvisor.PinnedVersion+", systrap, --network=none, default `runc spec` config", samples, err)
}

// createOn creates a sandbox of template on backend rt.
func (d *daemon) createOn(ctx context.Context, template, rt string) (string, error) {
	resp, err := d.do(ctx, http.MethodPost, "/v1/sandboxes", api.CreateSandboxRequest{
		Template: template,
		Runtime:  rt,
		Labels:   map[string]string{benchLabel: "1"},
	})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", statusError(resp)
	}
	var sb api.Sandbox
	if err := json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&sb); err != nil {
		return "", fmt.Errorf("decoding sandbox: %w", err)
	}
	if sb.ID == "" {
		return "", errors.New("create returned an empty id")
	}
	return sb.ID, nil
}
