package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestTenantDiskQuotaCountsCheckpoints: a tenant's checkpoints count
// against its disk quota next to its sandboxes' disk limits. Checkpoints of
// a sandbox holding 40 MiB are taken until one is refused (429 with
// Retry-After) — before the quota is exceeded, not by more than one
// checkpoint's layer — and the refused one leaves no record and no layer;
// the implicit checkpoints of fork and of a transactional exec, and a
// template save, are refused likewise; deleting a checkpoint lets a new
// one through; tenant inspect shows the disk in use.
func TestTenantDiskQuotaCountsCheckpoints(t *testing.T) {
	const mib = int64(1) << 20
	const quota, sbDisk = 200 * mib, 64 * mib
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	c, key := tenantClient(t, d, base, "tenant-disk", api.Quotas{DiskBytes: quota}, api.ScopeFull)
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox", Resources: api.Resources{DiskBytes: sbDisk}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	mustRun(t, sb, "dd if=/dev/urandom of=/root/data bs=1M count=40 2>&1 && sync")

	layerRoot := filepath.Join(d.dataDir, "layers")
	layerDirs := func() []string {
		t.Helper()
		ents, err := os.ReadDir(layerRoot)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	checkpoints := func() []string {
		t.Helper()
		cks, err := c.Checkpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, ck := range cks {
			ids = append(ids, ck.ID)
		}
		return ids
	}
	post := func(path string, body string) (int, string, []byte) {
		t.Helper()
		return rawCall(t, base, key.Key, "POST", "/v1/sandboxes/"+sb.ID()+path, []byte(body))
	}
	wantRefused := func(what string, st int, retry string, body []byte) {
		t.Helper()
		if st != http.StatusTooManyRequests {
			t.Fatalf("%s over the disk quota: %d %s", what, st, body)
		}
		if n, err := strconv.Atoi(retry); err != nil || n <= 0 {
			t.Fatalf("%s over the disk quota: Retry-After %q", what, retry)
		}
	}

	var (
		taken    []api.Checkpoint
		held     int64 // the layers of taken
		largest  int64
		refusedN int
	)
	for i := 0; ; i++ {
		if i == 10 {
			t.Fatalf("10 checkpoints of 40 MiB taken within a %d MiB quota", quota/mib)
		}
		// A new marker each time: identical states would share one layer.
		mustRun(t, sb, fmt.Sprintf("echo %d > /root/marker", i))
		before := layerDirs()
		st, retry, body := post("/checkpoints", `{"name":"ck"}`)
		if st == http.StatusCreated {
			var ck api.Checkpoint
			if err := json.Unmarshal(body, &ck); err != nil {
				t.Fatal(err)
			}
			if ck.SizeBytes < 40*mib {
				t.Fatalf("checkpoint %s of a 40 MiB upper has size %d", ck.ID, ck.SizeBytes)
			}
			taken = append(taken, ck)
			held += ck.SizeBytes
			largest = max(largest, ck.SizeBytes)
			continue
		}
		wantRefused("checkpoint", st, retry, body)
		refusedN = i
		if got := layerDirs(); !slices.Equal(got, before) {
			t.Fatalf("the refused checkpoint left layers behind: %v, was %v", got, before)
		}
		if tmp, _ := os.ReadDir(filepath.Join(layerRoot, "tmp")); len(tmp) != 0 {
			t.Fatalf("the refused checkpoint left %d entries in the layer store's tmp", len(tmp))
		}
		break
	}
	t.Logf("%d checkpoints of up to %d bytes admitted, the next refused", len(taken), largest)
	if len(taken) == 0 {
		t.Fatal("not even one checkpoint fits")
	}
	// Never over the quota, and refused only when the next would go over.
	if used := sbDisk + held; used > quota {
		t.Fatalf("admitted %d bytes (sandbox %d + checkpoints %d) over a quota of %d", used, sbDisk, held, quota)
	}
	if used := sbDisk + held + largest; used <= quota {
		t.Fatalf("checkpoint %d refused with %d of %d bytes in use", refusedN, sbDisk+held, quota)
	}
	want := []string{}
	for _, ck := range taken {
		want = append(want, ck.ID)
	}
	if got := checkpoints(); !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("checkpoints %v after a refused one, want %v", got, want)
	}

	// tenant inspect: the tenant itself and the admin's CLI see the disk
	// in use, checkpoints included.
	tn, err := c.Tenant(ctx, "tenant-disk")
	if err != nil {
		t.Fatal(err)
	}
	if u := tn.Usage; u == nil || u.DiskBytes != sbDisk+held || u.LayerBytes != held || u.Sandboxes != 1 {
		t.Fatalf("tenant usage %+v, want disk %d (layers %d)", tn.Usage, sbDisk+held, held)
	}
	var inspected api.Tenant
	if err := json.Unmarshal([]byte(cliRun(t, d, "tenant", "inspect", "tenant-disk")), &inspected); err != nil {
		t.Fatal(err)
	}
	if u := inspected.Usage; u == nil || u.DiskBytes != sbDisk+held || u.LayerBytes != held {
		t.Fatalf("agentbox tenant inspect usage %+v", inspected.Usage)
	}

	// The implicit checkpoints and template saves are refused the same
	// way, and leave nothing either.
	before, beforeCks := layerDirs(), checkpoints()
	st, retry, body := post("/fork", `{}`)
	wantRefused("fork", st, retry, body)
	st, retry, body = post("/exec", `{"cmd":["true"],"checkpoint_before":true}`)
	wantRefused("exec with checkpoint_before", st, retry, body)
	st, retry, body = post("/template", `{"name":"app"}`)
	wantRefused("template save", st, retry, body)
	if got := layerDirs(); !slices.Equal(got, before) {
		t.Fatalf("refused operations left layers behind: %v, was %v", got, before)
	}
	if got := checkpoints(); !slices.Equal(sorted(got), sorted(beforeCks)) {
		t.Fatalf("refused operations left checkpoints %v, was %v", got, beforeCks)
	}
	if sbs, err := c.List(ctx, nil); err != nil || len(sbs) != 1 {
		t.Fatalf("tenant has %d sandboxes after a refused fork, %v", len(sbs), err)
	}

	// Deleting a checkpoint frees its layer: the next one goes through.
	if err := c.DeleteCheckpoint(ctx, taken[0].ID); err != nil {
		t.Fatal(err)
	}
	ck, err := sb.Checkpoint(ctx, "after-delete")
	if err != nil {
		t.Fatalf("checkpoint after deleting one: %v", err)
	}
	held += ck.SizeBytes - taken[0].SizeBytes
	if tn, err := c.Tenant(ctx, "tenant-disk"); err != nil || tn.Usage == nil || tn.Usage.DiskBytes != sbDisk+held {
		t.Fatalf("usage after delete and checkpoint: %+v %v, want disk %d", tn.Usage, err, sbDisk+held)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
