package guest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The account cache never serves a stale passwd: a same-size edit right
// after a read is seen (the file is too fresh to be cached), and so is an
// edit that puts the old modification time back (the change time moves).
func TestLookupAccountSeesEdits(t *testing.T) {
	etc := t.TempDir()
	write := func(uid string) {
		t.Helper()
		data := "root:x:0:0:root:/root:/bin/sh\napp:x:" + uid + ":100:app:/home/app:/bin/sh\n"
		if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(etc, "group"), []byte("users:x:100:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	uidOf := func() uint32 {
		t.Helper()
		a, err := lookupAccount(etc, "app")
		if err != nil {
			t.Fatal(err)
		}
		return a.uid
	}
	write("1001")
	if got := uidOf(); got != 1001 {
		t.Fatalf("uid %d, want 1001", got)
	}
	write("1002") // same size, within the same second
	if got := uidOf(); got != 1002 {
		t.Fatalf("after a same-size edit: uid %d, want 1002", got)
	}

	// An old file is cached; an edit that restores its mtime still shows.
	old := time.Now().Add(-time.Hour)
	passwd := filepath.Join(etc, "passwd")
	if err := os.Chtimes(passwd, old, old); err != nil {
		t.Fatal(err)
	}
	time.Sleep(racyWindow + 100*time.Millisecond) // the ctime of Chtimes ages too
	if got := uidOf(); got != 1002 {
		t.Fatalf("uid %d, want 1002", got)
	}
	if _, ok := etcFiles.entries[etcKey{passwd, 7}]; !ok {
		t.Fatal("an unchanged old passwd is not cached")
	}
	write("1003")
	if err := os.Chtimes(passwd, old, old); err != nil {
		t.Fatal(err)
	}
	if got := uidOf(); got != 1003 {
		t.Fatalf("after an edit with the mtime put back: uid %d, want 1003", got)
	}
	if err := os.Remove(passwd); err != nil {
		t.Fatal(err)
	}
	if _, err := lookupAccount(etc, "app"); err == nil {
		t.Fatal("a removed passwd still resolves its users")
	}
}
