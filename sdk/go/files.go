package agentbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"

	"github.com/agentbox/agentbox/api"
)

// ReadFile returns the whole content of the file at path inside the sandbox.
// Use OpenFile for large files.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	rc, err := s.OpenFile(ctx, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, wrapf(err, "reading %s in sandbox %s", path, s.id)
	}
	return b, nil
}

// OpenFile streams the file at path inside the sandbox. The caller closes
// the reader; a read error means the transfer broke off.
func (s *Sandbox) OpenFile(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.path("/files"), query: url.Values{"path": {path}}})
	if err != nil {
		return nil, wrapf(err, "opening %s in sandbox %s", path, s.id)
	}
	return resp.Body, nil
}

// WriteFile writes data to the file at path inside the sandbox, creating it
// (and missing parent directories) or truncating it. Mode 0 means 0644.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, mode os.FileMode) error {
	return s.writeFile(ctx, path, bytes.NewReader(data), int64(len(data)), mode)
}

// WriteFileFrom is WriteFile with the content streamed from r until EOF;
// r is never buffered whole.
func (s *Sandbox) WriteFileFrom(ctx context.Context, path string, r io.Reader, mode os.FileMode) error {
	return s.writeFile(ctx, path, r, -1, mode)
}

func (s *Sandbox) writeFile(ctx context.Context, path string, r io.Reader, size int64, mode os.FileMode) error {
	if mode == 0 {
		mode = 0o644
	}
	q := url.Values{
		"path":    {path},
		"mode":    {fmt.Sprintf("%04o", uint32(mode.Perm())|uint32(modeSpecial(mode)))},
		"parents": {"true"},
	}
	var fi api.FileInfo
	err := s.c.call(ctx, request{method: http.MethodPut, path: s.path("/files"), query: q,
		body: r, ctype: "application/octet-stream", size: size}, &fi)
	if err != nil {
		return wrapf(err, "writing %s in sandbox %s", path, s.id)
	}
	return nil
}

// modeSpecial maps Go's setuid/setgid/sticky bits onto their Unix values.
func modeSpecial(m os.FileMode) uint32 {
	var v uint32
	if m&os.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}

// Stat describes the entry at path inside the sandbox (symlinks not followed).
func (s *Sandbox) Stat(ctx context.Context, path string) (api.FileInfo, error) {
	var fi api.FileInfo
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/fs/stat"), query: url.Values{"path": {path}}}, &fi); err != nil {
		return api.FileInfo{}, wrapf(err, "stat %s in sandbox %s", path, s.id)
	}
	return fi, nil
}

// ListDir lists the entries of the directory at path inside the sandbox.
func (s *Sandbox) ListDir(ctx context.Context, path string) ([]api.FileInfo, error) {
	var list api.FileList
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/fs/list"), query: url.Values{"path": {path}}}, &list); err != nil {
		return nil, wrapf(err, "listing %s in sandbox %s", path, s.id)
	}
	return list.Entries, nil
}

// Mkdir creates the directory path (mode 0755), and its missing parents
// when parents is set.
func (s *Sandbox) Mkdir(ctx context.Context, path string, parents bool) error {
	var fi api.FileInfo
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/fs/mkdir"), json: api.MkdirRequest{Path: path, Parents: parents}}, &fi); err != nil {
		return wrapf(err, "creating directory %s in sandbox %s", path, s.id)
	}
	return nil
}

// Move renames from to to inside the sandbox.
func (s *Sandbox) Move(ctx context.Context, from, to string) error {
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/fs/move"), json: api.MoveRequest{From: from, To: to}}, nil); err != nil {
		return wrapf(err, "moving %s to %s in sandbox %s", from, to, s.id)
	}
	return nil
}

// Remove deletes path inside the sandbox; a non-empty directory only when
// recursive is set.
func (s *Sandbox) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}, "recursive": {strconv.FormatBool(recursive)}}
	if err := s.c.call(ctx, request{method: http.MethodDelete, path: s.path("/fs"), query: q}, nil); err != nil {
		return wrapf(err, "removing %s in sandbox %s", path, s.id)
	}
	return nil
}

// DownloadDir streams the directory at path as a tar archive whose entries
// are relative to path. The caller closes the reader. The archive comes from
// inside the sandbox: treat its entry names as untrusted.
func (s *Sandbox) DownloadDir(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.path("/fs/archive"), query: url.Values{"path": {path}}})
	if err != nil {
		return nil, wrapf(err, "downloading %s from sandbox %s", path, s.id)
	}
	return resp.Body, nil
}

// UploadDir extracts the tar stream read from archive under the directory
// path inside the sandbox (created if missing). The archive is streamed.
func (s *Sandbox) UploadDir(ctx context.Context, path string, archive io.Reader) error {
	err := s.c.call(ctx, request{method: http.MethodPut, path: s.path("/fs/archive"), query: url.Values{"path": {path}},
		body: archive, ctype: "application/x-tar", size: -1}, nil)
	if err != nil {
		return wrapf(err, "uploading to %s in sandbox %s", path, s.id)
	}
	return nil
}
