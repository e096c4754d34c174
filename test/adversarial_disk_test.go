package test

import (
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// The defaults of a daemon started without disk flags (internal/config).
const (
	defaultDiskBytes  = 10 << 30
	defaultDiskInodes = 512 << 10
)

// infoFields is GET /v1/info as a client that knows nothing of the daemon's
// types sees it.
func infoFields(t *testing.T, base, key string) map[string]any {
	t.Helper()
	st, _, body := rawCall(t, base, key, "GET", "/v1/info", nil)
	if st != http.StatusOK {
		t.Fatalf("GET /v1/info: %d %s", st, body)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("GET /v1/info: %v\n%s", err, body)
	}
	return m
}

// statfsInside is what statfs(2) of path reports inside sb: total bytes
// and total inodes.
func statfsInside(t *testing.T, sb *agentbox.Sandbox, path string) (bytes, inodes int64) {
	t.Helper()
	out := strings.Fields(mustRun(t, sb, "stat -f -c '%b %S %c' "+path))
	if len(out) != 3 {
		t.Fatalf("stat -f %s: %q", path, out)
	}
	var n [3]int64
	for i, s := range out {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("stat -f %s: %q", path, out)
		}
		n[i] = v
	}
	return n[0] * n[1], n[2]
}

// hostBytes is what dir holds on the host's filesystem: the blocks of its
// files on dir's own device (du -sx), so a sandbox's quota filesystem
// counts as its image file, not twice.
func hostBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var root syscall.Stat_t
	if err := syscall.Lstat(dir, &root); err != nil {
		t.Fatal(err)
	}
	var total int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		total += st.Blocks * 512
		return nil
	})
	return total
}

// A tenant that asks for no disk limit still gets one: a daemon started
// without disk flags gives every sandbox a 10 GiB, 512 Ki-inode writable
// layer, shown in GET /v1/info and in inspect; statfs inside reports it,
// so an allocation past it fails with ENOSPC inside instead of taking the
// host's disk.
func TestAdversarialDiskDefaultLimit(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	c, key := tenantClient(t, d, base, "disk-default", api.Quotas{}, api.ScopeFull)

	info := infoFields(t, base, key.Key)
	if got, _ := info["default_disk_bytes"].(float64); got != defaultDiskBytes {
		t.Errorf("GET /v1/info default_disk_bytes = %v; want %d (info %v)", info["default_disk_bytes"], int64(defaultDiskBytes), info)
	}
	if got, _ := info["default_disk_inodes"].(float64); got != defaultDiskInodes {
		t.Errorf("GET /v1/info default_disk_inodes = %v; want %d", info["default_disk_inodes"], defaultDiskInodes)
	}
	if got := agentboxInfo(t, d); got.DiskQuota == "" {
		t.Errorf("agentbox info: disk_quota empty: the default cannot be enforced here")
	}
	cmd := exec.Command(agentboxBin(t), "info")
	cmd.Env = append(os.Environ(), "AGENTBOX_HOST=unix://"+d.socket)
	if out, err := cmd.CombinedOutput(); err != nil || !regexp.MustCompile(`Default disk:\s+10\.0GiB, 524288 inodes`).Match(out) {
		t.Errorf("agentbox info: %v\n%s", err, out)
	}

	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	sbFull, err := c.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	got := sbFull.Info()
	if r := got.Resources; r.DiskBytes != defaultDiskBytes || r.DiskInodes != defaultDiskInodes {
		t.Errorf("inspect: disk_bytes %d, disk_inodes %d; want the defaults %d, %d", r.DiskBytes, r.DiskInodes, int64(defaultDiskBytes), defaultDiskInodes)
	}
	if got.Disk == nil || got.Disk.TotalBytes > defaultDiskBytes || got.Disk.TotalInodes > defaultDiskInodes {
		t.Errorf("inspect: disk usage %+v; want a quota of at most %d bytes, %d inodes", got.Disk, int64(defaultDiskBytes), defaultDiskInodes)
	}
	total, inodes := statfsInside(t, sb, "/root")
	if total > defaultDiskBytes || inodes > defaultDiskInodes {
		t.Fatalf("statfs inside: a %d-byte filesystem with %d inodes; want at most the default %d bytes, %d inodes (no default disk limit)", total, inodes, int64(defaultDiskBytes), defaultDiskInodes)
	}
	// Only once the limit is known to be there: allocating past it fails
	// inside (fallocate writes no data, so this costs the host nothing).
	res := run(t, sb, "fallocate -l 11G /root/big; echo rc=$?; ls -l /root/big 2>/dev/null; rm -f /root/big")
	if !strings.Contains(string(res.Stdout), "rc=1") && !strings.Contains(string(res.Stdout), "rc=2") {
		t.Errorf("fallocate 11G past the default: %s %s", res.Stdout, res.Stderr)
	}
	if !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("fallocate 11G: stderr %q; want ENOSPC", res.Stderr)
	}

	// A tenant cannot lift its sandbox above the default, nor its inodes.
	for _, body := range []string{
		`{"template":"busybox","resources":{"disk_bytes":21474836480}}`,
		`{"template":"busybox","resources":{"disk_inodes":1048576}}`,
	} {
		st, _, resp := rawCall(t, base, key.Key, "POST", "/v1/sandboxes", []byte(body))
		if st != http.StatusBadRequest && st != http.StatusForbidden {
			t.Errorf("tenant create %s: %d %s; want 400 or 403", body, st, resp)
		}
	}
	// A smaller limit is the tenant's to choose.
	small, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox", Resources: api.Resources{DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatalf("tenant create with a 64 MiB disk: %v", err)
	}
	defer small.Delete(context.WithoutCancel(ctx))
	if total, _ := statfsInside(t, small, "/root"); total > 64<<20 {
		t.Errorf("statfs inside a 64 MiB sandbox: %d bytes", total)
	}
}

// With a small default configured, a tenant filling its sandbox from
// inside (dd of random data, then thousands of empty files) stops at the
// limit with ENOSPC, and the host's data dir grows by at most about the
// limit.
func TestAdversarialDiskFillStopsAtDefault(t *testing.T) {
	const limit, inodes = 64 << 20, 4096
	addr := loopbackAddr(t)
	d := newDaemonWith(t, "--tcp", addr, "--default-disk-bytes", strconv.Itoa(limit), "--default-disk-inodes", strconv.Itoa(inodes))
	base := "http://" + addr
	ctx := context.Background()
	c, _ := tenantClient(t, d, base, "disk-fill", api.Quotas{}, api.ScopeFull)
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))

	before := hostBytes(t, d.dataDir)
	res := run(t, sb, "dd if=/dev/urandom of=/root/fill bs=1M count=200; sync")
	if !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("dd of 200 MiB into a %d-byte default: stderr %q; want ENOSPC", limit, res.Stderr)
	}
	grown := hostBytes(t, d.dataDir) - before
	if grown > limit+8<<20 {
		t.Errorf("the host's data dir grew by %d bytes for a %d-byte default", grown, limit)
	}
	t.Logf("host data dir grew by %d bytes (limit %d)", grown, limit)

	mustRun(t, sb, "rm -f /root/fill")
	res = run(t, sb, "mkdir /root/d && cd /root/d && seq 1 6000 | xargs touch; ls /root/d | wc -l")
	n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if n == 0 || n >= inodes || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("6000 empty files into a %d-inode default: %d made, stderr %.200q; want ENOSPC before %d", inodes, n, res.Stderr, inodes)
	}
}

// Duplicate keys in a JSON body are refused with 400 at any depth, also
// keys that differ only in case where the decoder would match both to one
// field: which of the two wins is a parser's guess, and a proxy in front
// may have guessed the other way.
func TestAdversarialJSONDuplicateKeys(t *testing.T) {
	d := newDaemon(t)
	for _, body := range []string{
		`{"template":"busybox","template":"busybox"}`,
		`{"template":"busybox","Template":"busybox"}`,
		`{"template":"busybox","resources":{"memory_bytes":67108864,"memory_bytes":1}}`,
		`{"template":"busybox","resources":{"disk_bytes":67108864,"DISK_BYTES":0}}`,
		`{"template":"busybox","labels":{"a":"1","a":"2"}}`,
		`{"template":"busybox","network":{"mode":"none","mode":"none"}}`,
	} {
		st, resp := d.rawRequest(t, "POST", "/v1/sandboxes", []byte(body))
		if st != http.StatusBadRequest {
			t.Errorf("POST /v1/sandboxes %s: %d %s; want 400", body, st, resp)
		} else if !strings.Contains(string(resp), "duplicate") {
			t.Errorf("POST /v1/sandboxes %s: 400 %s; want it to name the duplicate key", body, resp)
		}
	}
	// Keys of a map differing in case are different keys.
	st, resp := d.rawRequest(t, "POST", "/v1/sandboxes", []byte(`{"template":"busybox","labels":{"a":"1","A":"2"}}`))
	if st != http.StatusCreated && st != http.StatusOK {
		t.Errorf("labels a and A: %d %s; want the sandbox created", st, resp)
	}
}

// The default limit leaves nothing behind: sandboxes created with it
// survive a daemon killed with SIGKILL still capped; once they are deleted
// and the daemon stopped, no quota mount, loop device, sandbox image or
// template image (disks/template) is left, also of the killed daemon.
func TestAdversarialDiskDefaultRecovery(t *testing.T) {
	d := newDaemon(t)
	var sbs []*agentbox.Sandbox
	for range 3 {
		sb := d.create(t, agentbox.SandboxSpec{})
		mustRun(t, sb, "echo kept > /root/f")
		sbs = append(sbs, sb)
	}
	tmpl := filepath.Join(d.dataDir, "disks", "template")
	before, _ := filepath.Glob(filepath.Join(tmpl, "*.img"))
	if len(before) != 1 {
		t.Fatalf("template images: %v; want one", before)
	}
	// What a killed daemon leaves in the template dir (a copy it was
	// making) is gone after the restart, and the template is remade.
	d.stop(syscall.SIGKILL)
	stale := filepath.Join(tmpl, "stale.img")
	if err := os.WriteFile(stale, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.start()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a killed daemon's file in %s survived the restart: %v", tmpl, err)
	}
	if after, _ := filepath.Glob(filepath.Join(tmpl, "*.img")); len(after) != 1 {
		t.Errorf("template images after the restart: %v; want one", after)
	}
	for _, sb := range sbs {
		if got := mustRun(t, sb, "cat /root/f"); got != "kept\n" {
			t.Fatalf("after restart: %q", got)
		}
		if total, inodes := statfsInside(t, sb, "/root"); total > defaultDiskBytes || inodes > defaultDiskInodes {
			t.Fatalf("after restart: a %d-byte filesystem with %d inodes", total, inodes)
		}
	}
	deleteAllDisksGone(t, d, sbs...)
	d.stop(syscall.SIGTERM)
	if m := mountsUnder(t, d.dataDir); len(m) != 0 {
		t.Errorf("mounts left after shutdown: %v", m)
	}
	eventually(t, "no loop devices", func() bool { return len(loopsOf(t, d.dataDir)) == 0 })
	if left, _ := filepath.Glob(filepath.Join(d.dataDir, "disks", "*", "*")); len(left) != 0 {
		t.Errorf("left in disks/ after shutdown: %v", left)
	}
	d.start()
}

// A tenant's template build cannot take the host's disk either: a run
// step's writable layer is capped at the default limit like a sandbox's,
// so a step writing past it fails with ENOSPC and the build fails, and
// nothing of it is left (no mount, loop device or image).
func TestAdversarialDiskBuildStepLimit(t *testing.T) {
	const limit = 64 << 20
	addr := loopbackAddr(t)
	d := newDaemonWith(t, "--tcp", addr, "--default-disk-bytes", strconv.Itoa(limit))
	c, _ := tenantClient(t, d, "http://"+addr, "disk-build", api.Quotas{}, api.ScopeFull)
	ctx := context.Background()
	var out strings.Builder
	_, err := c.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: &api.TemplateSpec{
		Name:  "filler",
		Base:  "busybox",
		Steps: []api.TemplateStep{{Run: "dd if=/dev/zero of=/fill bs=1M count=200 && sync"}},
	}}, func(ev api.BuildEvent) { out.WriteString(ev.Message + "\n") })
	if err == nil {
		t.Fatalf("a build step wrote 200 MiB under a %d-byte default disk limit:\n%s", limit, out.String())
	}
	if !strings.Contains(out.String()+err.Error(), "No space left") {
		t.Errorf("build failed, but not for space: %v\n%s", err, out.String())
	}
	// A step within the limit builds as before: its layer, copied out of
	// the capped filesystem, keeps owners, symlinks and deletions.
	tmpl, err := c.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: &api.TemplateSpec{
		Name: "fits",
		Base: "busybox",
		Steps: []api.TemplateStep{{Run: "echo built > /etc/built && mkdir /home/u && chown 1000:1000 /home/u && " +
			"ln -s /etc/built /etc/link && rm /bin/vi && dd if=/dev/zero of=/ok bs=1M count=8 2>/dev/null"}},
	}}, nil)
	if err != nil {
		t.Fatalf("a build step within the limit: %v", err)
	}
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: tmpl.Name})
	if err != nil {
		t.Fatal(err)
	}
	got := mustRun(t, sb, "cat /etc/link; stat -c %u /home/u; test -e /bin/vi && echo vi; wc -c < /ok")
	if got != "built\n1000\n8388608\n" {
		t.Errorf("sandbox of the built template: %q", got)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "no quota mounts after the build", func() bool {
		return len(mountsUnder(t, filepath.Join(d.dataDir, "sandboxes")+"/")) == 0
	})
	eventually(t, "no loop devices after the build", func() bool { return len(loopsOf(t, d.dataDir)) == 0 })
	if imgs, _ := filepath.Glob(filepath.Join(d.dataDir, "disks", "*.img")); len(imgs) != 0 {
		t.Errorf("images left: %v", imgs)
	}
}
