package tarcheck

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil/rawtar"
)

func TestSparse(t *testing.T) {
	x := []byte("x")
	var plain rawtar.Builder
	plain.Add(rawtar.Entry{Name: "f", Typeflag: '0', Size: 1, Data: x})
	for name, tc := range map[string]struct {
		b    []byte
		want bool
	}{
		"pax1.0": {rawtar.PAXSparse1("f", 1<<20, x), true},
		"pax0.1": {rawtar.PAXSparse0("f", 1<<20, x), true},
		"oldgnu": {rawtar.OldGNUSparse("f", 1<<20, x), true},
		"plain":  {plain.Bytes(), false},
	} {
		hdr, err := tar.NewReader(bytes.NewReader(tc.b)).Next()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := Sparse(hdr); got != tc.want {
			t.Errorf("%s: Sparse = %v", name, got)
		}
	}
	if !errdefs.IsInvalidArgument(ErrSparse("f")) {
		t.Error("ErrSparse is not an invalid argument")
	}
}

func TestRoom(t *testing.T) {
	st := &unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bavail: 100, Files: 10, Ffree: 1}
	exhausted := func(err error) bool { return errors.Is(err, errdefs.ErrResourceExhausted) }
	for _, tc := range []struct {
		size int64
		keep uint64
		full bool
	}{
		{0, 0, false},
		{100 * 4096, 0, false},
		{100*4096 + 1, 0, true},
		{1 << 62, 0, true},
		{50 * 4096, 5, false},
		{51 * 4096, 5, true}, // 5% of 1000 blocks kept
		{0, 20, true},        // already below the reserve
	} {
		if got := exhausted(room(st, "f", tc.size, tc.keep)); got != tc.full {
			t.Errorf("size %d keep %d%%: exhausted %v", tc.size, tc.keep, got)
		}
	}
	noInode := *st
	noInode.Ffree = 0
	if !exhausted(room(&noInode, "f", 0, 0)) {
		t.Error("no free inode accepted")
	}
	noCount := noInode
	noCount.Files = 0
	if err := room(&noCount, "f", 0, 0); err != nil {
		t.Errorf("filesystem without inode counts: %v", err)
	}
	f, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Room(int(f.Fd()), "f", 1, 0); err != nil {
		t.Errorf("one byte in a temp dir: %v", err)
	}
	if err := Room(int(f.Fd()), "f", 1<<62, 0); !exhausted(err) {
		t.Errorf("4 EiB in a temp dir: %v", err)
	}
}
