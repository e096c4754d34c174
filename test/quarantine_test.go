package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// A record torn on disk is quarantined at start-up: the daemon still
// starts, reports the record on GET /v1/admin/quarantine, removes what the
// record described (its guest, cgroup and directory) and keeps the other
// sandboxes running.
func TestCorruptRecordQuarantined(t *testing.T) {
	parent := "abx-quar-" + randHex(4)
	t.Setenv("AGENTBOX_CGROUP_PARENT", parent)
	t.Cleanup(func() { removeCgroupParent(t, parent) })
	d := newDaemon(t)
	keep := d.create(t, agentbox.SandboxSpec{})
	victim := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, keep, "echo kept > /root/f")

	d.stop(syscall.SIGKILL)
	db, err := bolt.Open(filepath.Join(d.dataDir, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("sandboxes")).Put([]byte(victim.ID()), []byte(`{"sandbox":{"id":"`+victim.ID()))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	d.start()

	code, body := d.rawRequest(t, "GET", "/v1/admin/quarantine", nil)
	if code != 200 {
		t.Fatalf("GET /v1/admin/quarantine: %d %s", code, body)
	}
	var q []api.QuarantinedRecord
	if err := json.Unmarshal(body, &q); err != nil {
		t.Fatal(err)
	}
	if len(q) != 1 || q[0].Bucket != "sandboxes" || q[0].Key != victim.ID() || !strings.HasPrefix(string(q[0].Raw), `{"sandbox"`) {
		t.Fatalf("quarantine = %+v", q)
	}
	if got := strings.TrimSpace(mustRun(t, keep, "cat /root/f")); got != "kept" {
		t.Fatalf("other sandbox after restart: %q", got)
	}
	sbs, err := d.client.List(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.ID() == victim.ID() {
			t.Fatal("quarantined sandbox still listed")
		}
	}
	if dirs := cgroupDirsUnder(parent, victim.ID()); len(dirs) > 0 {
		t.Errorf("cgroups of the quarantined sandbox remain: %v", dirs)
	}
	if _, err := os.Stat(filepath.Join(d.dataDir, "sandboxes", victim.ID())); err == nil {
		t.Error("directory of the quarantined sandbox remains")
	}
	// A second start finds nothing new to quarantine.
	d.restart(syscall.SIGTERM)
	_, body = d.rawRequest(t, "GET", "/v1/admin/quarantine", nil)
	if err := json.Unmarshal(body, &q); err != nil || len(q) != 1 {
		t.Fatalf("after a second start: %s", body)
	}
}
