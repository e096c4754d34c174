package guest_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/testutil"
)

// WriteFileAs and MkdirAs give what they create (parents included) to
// the owner; what existed before keeps its owner.
func TestOwnedWriteAndMkdir(t *testing.T) {
	testutil.RequiresRoot(t)
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	dir := t.TempDir()
	owned := func(p string, uid, gid int) {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
		}
	}
	f := filepath.Join(dir, "p", "q", "f")
	if _, err := c.WriteFileAs(ctx, f, "1234:2345", 0o644, true, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	owned(f, 1234, 2345)
	owned(filepath.Join(dir, "p", "q"), 1234, 2345)
	owned(filepath.Join(dir, "p"), 1234, 2345)
	owned(dir, 0, 0)
	d := filepath.Join(dir, "p", "d1", "d2")
	if _, err := c.MkdirAs(ctx, "nobody", api.MkdirRequest{Path: d, Parents: true}); err != nil {
		t.Fatal(err)
	}
	owned(d, 65534, 65534)
	owned(filepath.Join(dir, "p"), 1234, 2345)
	if _, err := c.WriteFileAs(ctx, filepath.Join(dir, "g"), "no-such-user", 0o644, false, strings.NewReader("x")); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unknown owner: %v, want invalid argument", err)
	}
}
