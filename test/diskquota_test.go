package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// agentboxInfo is `agentbox info --json` against d.
func agentboxInfo(t *testing.T, d *daemon) api.Info {
	t.Helper()
	cmd := exec.Command(agentboxBin(t), "info", "--json")
	cmd.Env = append(os.Environ(), "AGENTBOX_HOST=unix://"+d.socket)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("agentbox info: %v\n%s", err, out)
	}
	var info api.Info
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("agentbox info --json: %v\n%s", err, out)
	}
	return info
}

// projectTable reads the project ids the daemon of data dir handed out.
func projectTable(t *testing.T, data string) map[string]uint32 {
	t.Helper()
	var tbl struct {
		Projects map[string]uint32 `json:"projects"`
	}
	b, err := os.ReadFile(filepath.Join(data, "disks", diskquota.ProjectTable))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &tbl); err != nil {
		t.Fatal(err)
	}
	return tbl.Projects
}

// With the data dir on XFS mounted with prjquota, a sandbox's disk quota
// is an XFS project quota on its plain sandbox dir: agentbox info says
// xfs-project; a sandbox filling it gets ENOSPC inside (df shows the
// quota), the filesystem loses no more than the quota, inodes are capped,
// a neighbour keeps writing, inspect reports usage (also while
// hibernated); a daemon killed and restarted re-adopts the project; delete
// removes the dir and frees the project.
func TestLimitsDiskQuotaXFSProject(t *testing.T) {
	mnt := testutil.XFSProjectQuotaFS(t, 1024) // unmounted after the daemon's cleanup
	data := filepath.Join(mnt, "data")
	d := newDaemonWith(t, "--data-dir", data) // the last --data-dir wins
	d.dataDir = data
	ctx := context.Background()

	if info := agentboxInfo(t, d); info.DiskQuota != api.DiskQuotaXFSProject || info.DataDir != data {
		t.Fatalf("agentbox info: disk_quota %q, data dir %s; want %s on %s", info.DiskQuota, info.DataDir, api.DiskQuotaXFSProject, data)
	}
	const quota = 64 << 20
	full := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{DiskBytes: quota, DiskInodes: 2048}})
	neighbour := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{DiskBytes: quota}})
	// No mount per sandbox: only the daemon's own nosuid,nodev bind of
	// the sandboxes dir onto itself.
	sandboxes := filepath.Join(data, "sandboxes")
	if m := sandboxMounts(t, data); len(m) != 0 {
		t.Fatalf("mounts under the data dir with project quotas: %v", m)
	}
	dir := filepath.Join(sandboxes, full.ID())
	prid, inherit, err := diskquota.DirProject(dir)
	if err != nil || prid == 0 || !inherit {
		t.Fatalf("sandbox dir: project %d inherit %v, %v", prid, inherit, err)
	}
	if sub, _, err := diskquota.DirProject(filepath.Join(dir, "upper")); err != nil || sub != prid {
		t.Fatalf("upper dir: project %d, %v; want %d", sub, err, prid)
	}
	if got := projectTable(t, data)[full.ID()]; got != prid {
		t.Fatalf("project table has %d for %s, the dir %d", got, full.ID(), prid)
	}

	// Nothing else writes to this filesystem but the daemon (its store).
	fillDisk(t, full, quota, mnt, 16<<20)
	// statfs of a project dir reports the project's limit.
	if kb, _ := strconv.ParseInt(strings.TrimSpace(mustRun(t, full, "df -k / | tail -1 | awk '{print $2}'")), 10, 64); kb <= 0 || kb > quota>>10 {
		t.Fatalf("df inside reports %d KiB, quota is %d KiB", kb, quota>>10)
	}
	fillInodes(t, full, 2048)
	mustRun(t, neighbour, "dd if=/dev/zero of=/root/ok bs=1M count=16 2>/dev/null && echo written > /root/ok2")
	mustRun(t, full, "rm -rf /root/many && echo again > /root/again")

	sb, err := d.client.Get(ctx, full.ID())
	if err != nil {
		t.Fatal(err)
	}
	if du := sb.Info().Disk; du == nil || du.TotalBytes != quota || du.TotalInodes != 2048 || du.UsedInodes <= 0 || du.UsedBytes <= 0 {
		t.Fatalf("inspect disk = %+v", du)
	}
	// Hibernated: nothing to unmount, usage still reported; a call wakes
	// it with its files.
	if err := full.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if sb, err := d.client.Get(ctx, full.ID()); err != nil || sb.Info().Disk == nil || sb.Info().State != "hibernated" {
		t.Fatalf("hibernated: %+v, %v", sb.Info(), err)
	}
	if got := mustRun(t, full, "cat /root/again"); got != "again\n" {
		t.Fatalf("after wake: %q", got)
	}

	// A daemon killed and restarted keeps the project and its limit.
	d.restart(syscall.SIGKILL)
	if info := agentboxInfo(t, d); info.DiskQuota != api.DiskQuotaXFSProject {
		t.Fatalf("after restart: disk_quota %q", info.DiskQuota)
	}
	res := run(t, full, "dd if=/dev/zero of=/root/big bs=1M count=128 2>&1")
	if !strings.Contains(string(res.Stdout), "No space left") {
		t.Fatalf("quota lost across restart: %s", res.Stdout)
	}
	mustRun(t, full, "rm /root/big")

	// Delete removes the dir and frees the project.
	nprid, _, err := diskquota.DirProject(filepath.Join(sandboxes, neighbour.ID()))
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range []*agentbox.Sandbox{full, neighbour} {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// XFS inactivates unlinked inodes in the background: the count of a
	// removed dir's project drops a moment later.
	for _, p := range []uint32{prid, nprid} {
		eventually(t, fmt.Sprintf("project %d has no limits and no usage after delete", p), func() bool {
			u, err := diskquota.ProjectUsage(sandboxes, p)
			return errdefs.IsNotFound(err) || (err == nil && u == (diskquota.Usage{}))
		})
	}
	if tbl := projectTable(t, data); len(tbl) != 0 {
		t.Fatalf("project table after delete: %v", tbl)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir after delete: %v", err)
	}
	if m := sandboxMounts(t, data); len(m) != 0 {
		t.Fatalf("mounts under the data dir: %v", m)
	}
}

// sandboxMounts is mountsUnder the data dir but for the running daemon's
// own nosuid,nodev bind of its sandboxes dir onto itself: the mounts made
// for sandboxes.
func sandboxMounts(t *testing.T, data string) []string {
	t.Helper()
	var out []string
	for _, m := range mountsUnder(t, data+"/") {
		if m != filepath.Join(data, "sandboxes") {
			out = append(out, m)
		}
	}
	return out
}
