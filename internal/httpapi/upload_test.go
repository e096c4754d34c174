package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// An upload refused after part of its body was read (the guest found the
// disk full, or an archive entry it refuses) reaches a client that sends
// the whole body before reading (as Go's net/http and Python's requests
// do) as the error status, not as a broken pipe: the daemon drains the
// rest of the body first.
func TestRefusedUploadAnswersStatus(t *testing.T) {
	h, _ := newTestHandler(t, &partReader{}, Options{})
	// On a unix socket, as the daemon listens.
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	body := bytes.Repeat([]byte("x"), 32<<20)
	for _, path := range []string{"/v1/sandboxes/abc/files?path=/f", "/v1/sandboxes/abc/fs/archive?path=/d"} {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: agentbox\r\nContent-Length: %d\r\n\r\n", path, len(body)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(body); err != nil {
			t.Fatalf("%s: sending the body: %v", path, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s: %d, want 429", path, resp.StatusCode)
		}
	}
}

// partReader reads 1 MiB of an upload, then refuses it as the guest does
// when the disk is full.
type partReader struct{ fakeService }

func (p *partReader) refuse(r io.Reader) error {
	_, _ = io.CopyN(io.Discard, r, 1<<20)
	return errdefs.ErrResourceExhausted
}

func (p *partReader) WriteFile(ctx context.Context, id, path string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error) {
	return api.FileInfo{}, p.refuse(r)
}

func (p *partReader) WriteArchive(ctx context.Context, id, path string, r io.Reader) error {
	return p.refuse(r)
}
