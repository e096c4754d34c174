package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// checkPath validates a request path (see proto.CheckPath).
var checkPath = proto.CheckPath

// validFileInfo checks an entry decoded from the guest. Entries of a
// listing (entry) must have a plain name.
func validFileInfo(fi api.FileInfo, entry bool) error {
	switch fi.Type {
	case api.FileTypeFile, api.FileTypeDir, api.FileTypeSymlink, api.FileTypeOther:
	default:
		return protoErr("file type %q", fi.Type)
	}
	switch {
	case fi.Size < 0:
		return protoErr("negative size %d", fi.Size)
	case fi.Mode&^0o7777 != 0:
		return protoErr("mode %o", fi.Mode)
	case fi.UID < 0 || fi.GID < 0 || int64(fi.UID) > 1<<32-1 || int64(fi.GID) > 1<<32-1:
		return protoErr("owner %d:%d", fi.UID, fi.GID)
	case checkPath(fi.Path) != nil:
		return protoErr("invalid path in file info")
	case len(fi.Name) == 0 || len(fi.Name) > 255 && entry || strings.IndexByte(fi.Name, 0) >= 0:
		return protoErr("invalid name in file info")
	case len(fi.LinkTarget) > proto.MaxPathLen || strings.IndexByte(fi.LinkTarget, 0) >= 0:
		return protoErr("invalid link target in file info")
	}
	if entry && (strings.Contains(fi.Name, "/") || fi.Name == "." || fi.Name == "..") {
		return protoErr("list entry named %q", fi.Name)
	}
	return nil
}

// dataReader reads Data frames until the EOF frame; with limit ≥ 0 the
// stream must carry exactly limit bytes.
type dataReader struct {
	w     *wire
	buf   []byte
	n     int64
	limit int64
	err   error
}

func (r *dataReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		t, b, err := r.w.frame()
		if err != nil {
			r.err = err
			return 0, err
		}
		switch t {
		case proto.FrameData:
			r.n += int64(len(b))
			if r.limit >= 0 && r.n > r.limit {
				r.err = protoErr("%s: more than the announced %d bytes", r.w.op, r.limit)
				return 0, r.err
			}
			r.buf = b
		case proto.FrameEOF:
			if r.limit >= 0 && r.n != r.limit {
				r.err = protoErr("%s: %d bytes, announced %d", r.w.op, r.n, r.limit)
			} else {
				r.err = io.EOF
			}
		default:
			r.err = protoErr("%s: unexpected %s frame in data stream", r.w.op, t)
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *dataReader) Close() error { return r.w.close() }

// ReadFile opens a regular file; the reader yields exactly info.Size bytes
// (or an error) and must be closed.
func (c *Client) ReadFile(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	if err := checkPath(p); err != nil {
		return nil, api.FileInfo{}, err
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpReadFile, Path: p})
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	var fi api.FileInfo
	if err := w.result(&fi); err != nil {
		w.close()
		return nil, api.FileInfo{}, err
	}
	if err := validFileInfo(fi, false); err != nil {
		w.close()
		return nil, api.FileInfo{}, err
	}
	if fi.Type != api.FileTypeFile {
		w.close()
		return nil, api.FileInfo{}, protoErr("read_file of a %s", fi.Type)
	}
	return &dataReader{w: w, limit: fi.Size}, fi, nil
}

// WriteFile replaces the file at p with the content of r (streamed; written
// to a temporary file and renamed into place). mode 0 means 0644; parents
// creates missing parent directories. r is not read after return.
func (c *Client) WriteFile(ctx context.Context, p string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error) {
	return c.WriteFileAs(ctx, p, "", mode, parents, r)
}

// WriteFileAs is WriteFile with the file (and the parents it makes)
// owned by owner ("name", "uid" or "name:group" of the sandbox; "" is
// root).
func (c *Client) WriteFileAs(ctx context.Context, p, owner string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error) {
	if err := checkPath(p); err != nil {
		return api.FileInfo{}, err
	}
	if mode&^0o7777 != 0 {
		return api.FileInfo{}, fmt.Errorf("mode %o: %w", mode, errdefs.ErrInvalidArgument)
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpWriteFile, Path: p, Mode: mode, Parents: parents, Owner: owner})
	if err != nil {
		return api.FileInfo{}, err
	}
	defer w.close()
	var fi api.FileInfo
	if err := w.upload(proto.FrameData, r, &fi); err != nil {
		return api.FileInfo{}, err
	}
	if err := validFileInfo(fi, false); err != nil {
		return api.FileInfo{}, err
	}
	return fi, nil
}

// Stat describes p without following a final symlink.
func (c *Client) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	if err := checkPath(p); err != nil {
		return api.FileInfo{}, err
	}
	var fi api.FileInfo
	if err := c.call(ctx, &proto.Request{Op: proto.OpStat, Path: p}, &fi); err != nil {
		return api.FileInfo{}, err
	}
	if err := validFileInfo(fi, false); err != nil {
		return api.FileInfo{}, err
	}
	return fi, nil
}

// List returns the entries of directory p (unsorted, without . and ..).
func (c *Client) List(ctx context.Context, p string) ([]api.FileInfo, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpList, Path: p})
	if err != nil {
		return nil, err
	}
	defer w.close()
	out := []api.FileInfo{}
	for {
		t, b, err := w.frame()
		if err != nil {
			return nil, err
		}
		if t == proto.FrameEOF {
			return out, nil
		}
		if t != proto.FrameResult {
			return nil, protoErr("list: unexpected %s frame", t)
		}
		var batch []api.FileInfo
		if err := json.Unmarshal(b, &batch); err != nil {
			return nil, protoErr("list: undecodable batch: %v", err)
		}
		for _, fi := range batch {
			if err := validFileInfo(fi, true); err != nil {
				return nil, err
			}
		}
		if len(out)+len(batch) > c.maxEntries {
			return nil, fmt.Errorf("directory %s has more than %d entries: %w", p, c.maxEntries, errdefs.ErrTooLarge)
		}
		out = append(out, batch...)
	}
}

// Mkdir creates a directory (mode 0 means 0755).
func (c *Client) Mkdir(ctx context.Context, req api.MkdirRequest) (api.FileInfo, error) {
	return c.MkdirAs(ctx, "", req)
}

// MkdirAs is Mkdir with the directory (and the parents it makes) owned
// by owner ("" is root).
func (c *Client) MkdirAs(ctx context.Context, owner string, req api.MkdirRequest) (api.FileInfo, error) {
	if err := checkPath(req.Path); err != nil {
		return api.FileInfo{}, err
	}
	var fi api.FileInfo
	if err := c.call(ctx, &proto.Request{Op: proto.OpMkdir, Mkdir: &req, Owner: owner}, &fi); err != nil {
		return api.FileInfo{}, err
	}
	if err := validFileInfo(fi, false); err != nil {
		return api.FileInfo{}, err
	}
	return fi, nil
}

// Move renames req.From to req.To.
func (c *Client) Move(ctx context.Context, req api.MoveRequest) error {
	if err := checkPath(req.From); err != nil {
		return fmt.Errorf("from: %w", err)
	}
	if err := checkPath(req.To); err != nil {
		return fmt.Errorf("to: %w", err)
	}
	return c.call(ctx, &proto.Request{Op: proto.OpMove, Move: &req}, nil)
}

// Remove removes p; a non-empty directory only when recursive.
func (c *Client) Remove(ctx context.Context, p string, recursive bool) error {
	if err := checkPath(p); err != nil {
		return err
	}
	return c.call(ctx, &proto.Request{Op: proto.OpRemove, Path: p, Recursive: recursive}, nil)
}

// ReadArchive streams directory p as a tar archive with entries relative
// to p. The reader must be closed. The tar bytes come from the guest and
// are untrusted.
func (c *Client) ReadArchive(ctx context.Context, p string) (io.ReadCloser, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpReadArchive, Path: p})
	if err != nil {
		return nil, err
	}
	// Read ahead to the first frame so "not found" is an error here, not
	// from the reader.
	if _, err := w.br.Peek(1); err != nil {
		w.close()
		return nil, w.err(err)
	}
	if t, _ := w.br.Peek(1); proto.FrameType(t[0]) == proto.FrameError {
		_, _, err := w.frame()
		w.close()
		return nil, err
	}
	return &dataReader{w: w, limit: -1}, nil
}

// WriteArchive extracts the tar stream r into directory p (created if
// missing). r is not read after return.
func (c *Client) WriteArchive(ctx context.Context, p string, r io.Reader) error {
	if err := checkPath(p); err != nil {
		return err
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpWriteArchive, Path: p})
	if err != nil {
		return err
	}
	defer w.close()
	return w.upload(proto.FrameData, r, nil)
}
