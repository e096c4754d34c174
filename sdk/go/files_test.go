package agentbox_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"sort"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/sdk/go/agentboxtest"
)

func TestFiles(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	sb := newSandbox(t, srv)
	ctx := context.Background()

	if err := sb.WriteFile(ctx, "/work/a.txt", []byte("alpha"), 0o600); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if got, err := sb.ReadFile(ctx, "/work/a.txt"); err != nil || string(got) != "alpha" {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
	fi, err := sb.Stat(ctx, "/work/a.txt")
	if err != nil || fi.Type != api.FileTypeFile || fi.Size != 5 || fi.Mode != 0o600 {
		t.Fatalf("Stat = %+v, %v", fi, err)
	}
	if _, err := sb.ReadFile(ctx, "/nope"); err == nil || !strings.Contains(err.Error(), "/nope") {
		t.Fatalf("ReadFile missing = %v", err)
	}

	// A streamed upload: the body is sent chunked, as it is produced.
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 100; i++ {
			pw.Write(bytes.Repeat([]byte{'a' + byte(i%26)}, 1000))
		}
		pw.Close()
	}()
	if err := sb.WriteFileFrom(ctx, "/work/big", pr, 0); err != nil {
		t.Fatalf("WriteFileFrom: %v", err)
	}
	reqs := srv.Requests()
	last := reqs[len(reqs)-1]
	if last.Method != "PUT" || !last.Chunked || !strings.Contains(last.Query, "mode=0644") {
		t.Fatalf("upload request = %+v, want a chunked PUT with mode 0644", last)
	}
	rc, err := sb.OpenFile(ctx, "/work/big")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, rc)
	rc.Close()
	if err != nil || n != 100000 {
		t.Fatalf("OpenFile read %d bytes, %v", n, err)
	}

	if err := sb.Mkdir(ctx, "/work/sub/deeper", false); err == nil {
		t.Fatal("Mkdir without parents created missing parents")
	}
	if err := sb.Mkdir(ctx, "/work/sub/deeper", true); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	if err := sb.Move(ctx, "/work/a.txt", "/work/sub/b.txt"); err != nil {
		t.Fatalf("Move: %v", err)
	}
	entries, err := sb.ListDir(ctx, "/work")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name+":"+e.Type)
	}
	if strings.Join(names, ",") != "big:file,sub:dir" {
		t.Fatalf("ListDir = %v", names)
	}
	if err := sb.Remove(ctx, "/work/sub", false); err == nil {
		t.Fatal("Remove of a non-empty directory without recursive succeeded")
	}
	if err := sb.Remove(ctx, "/work/sub", true); err != nil {
		t.Fatalf("Remove recursive: %v", err)
	}
	if _, err := sb.Stat(ctx, "/work/sub/b.txt"); err == nil {
		t.Fatal("file survived a recursive remove")
	}
}

func TestDirArchives(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	sb := newSandbox(t, srv)
	ctx := context.Background()

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct{ name, body string }{{"top.txt", "T"}, {"d/inner.txt", "I"}} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o640, Size: int64(len(f.body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(f.body))
	}
	tw.Close()
	if err := sb.UploadDir(ctx, "/dst", &buf); err != nil {
		t.Fatalf("UploadDir: %v", err)
	}
	if got, err := sb.ReadFile(ctx, "/dst/d/inner.txt"); err != nil || string(got) != "I" {
		t.Fatalf("uploaded file = %q, %v", got, err)
	}

	rc, err := sb.DownloadDir(ctx, "/dst")
	if err != nil {
		t.Fatalf("DownloadDir: %v", err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "d/,d/inner.txt,top.txt" {
		t.Fatalf("archive entries = %v", names)
	}
}
