package guest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// checkPath validates a request path (see proto.CheckPath).
var checkPath = proto.CheckPath

func cleanPath(p string) (string, error) {
	if err := checkPath(p); err != nil {
		return "", err
	}
	return filepath.Clean(p), nil
}

// unixMode converts permission and special bits of m to their octal form.
func unixMode(m fs.FileMode) uint32 {
	out := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		out |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		out |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		out |= syscall.S_ISVTX
	}
	return out
}

// fileMode is the inverse of unixMode.
func fileMode(m uint32) fs.FileMode {
	out := fs.FileMode(m & 0o777)
	if m&syscall.S_ISUID != 0 {
		out |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		out |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		out |= fs.ModeSticky
	}
	return out
}

func fileInfo(path string, fi fs.FileInfo) api.FileInfo {
	out := api.FileInfo{
		Name:    fi.Name(),
		Path:    path,
		Size:    fi.Size(),
		Mode:    unixMode(fi.Mode()),
		ModTime: fi.ModTime().UTC(),
	}
	if path == "/" {
		out.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		out.Type = api.FileTypeFile
	case fi.IsDir():
		out.Type = api.FileTypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		out.Type = api.FileTypeSymlink
		out.LinkTarget, _ = os.Readlink(path)
	default:
		out.Type = api.FileTypeOther
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out.UID, out.GID = int(st.Uid), int(st.Gid)
	}
	return out
}

func lstatInfo(path string) (api.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return api.FileInfo{}, err
	}
	return fileInfo(path, fi), nil
}

// dataWriter writes Data frames of at most proto.ChunkSize bytes.
type dataWriter struct{ c *conn }

func (w dataWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), proto.ChunkSize)
		if err := w.c.frame(proto.FrameData, b[:k]); err != nil {
			return n, err
		}
		n += k
		b = b[k:]
	}
	return n, nil
}

// dataReader reads the payload of Data frames until an EOF frame.
type dataReader struct {
	c    *conn
	buf  []byte
	done bool
}

func (r *dataReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		t, b, err := proto.ReadFrame(r.c.br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, fmt.Errorf("reading data frames: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		switch t {
		case proto.FrameData:
			r.buf = b
		case proto.FrameEOF:
			r.done = true
		default:
			return 0, fmt.Errorf("unexpected %s frame in data stream: %w", t, errdefs.ErrInvalidArgument)
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (s *server) readFile(c *conn, req *proto.Request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	f, fi, err := openRegular(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := proto.WriteJSONFrame(c.bw, proto.FrameResult, fileInfo(path, fi)); err != nil {
		return err
	}
	n, err := io.CopyN(dataWriter{c}, f, fi.Size())
	if err != nil {
		if n < fi.Size() && errors.Is(err, io.EOF) {
			return fmt.Errorf("%s shrank while being read: %w", path, errdefs.ErrConflict)
		}
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if err := c.frame(proto.FrameEOF, nil); err != nil {
		return err
	}
	return c.bw.Flush()
}

func (s *server) writeFile(c *conn, req *proto.Request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	if path == "/" {
		return fmt.Errorf("cannot write to /: %w", errdefs.ErrInvalidArgument)
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o644
	}
	if mode&^0o7777 != 0 {
		return fmt.Errorf("mode %o: %w", mode, errdefs.ErrInvalidArgument)
	}
	owner, err := s.owner(req.Owner)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if req.Parents {
		if err := mkdirAllOwned(dir, owner); err != nil {
			return fmt.Errorf("creating parents of %s: %w", path, err)
		}
	}
	// The new file replaces whatever is at path (a symlink itself, not its
	// target) unless that is a directory or a special file, and never
	// lands on a kernel pseudo filesystem.
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
		return notRegular(path, fi.Mode())
	}
	if err := checkFSPath(dir); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".agentbox-write-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, &dataReader{c: c}); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if owner != nil {
		if err := tmp.Chown(int(owner.uid), int(owner.gid)); err != nil {
			return fmt.Errorf("chown %s: %w", path, err)
		}
	}
	if err := tmp.Chmod(fileMode(mode)); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("renaming into %s: %w", path, err)
	}
	ok = true
	info, err := lstatInfo(path)
	if err != nil {
		return err // an *fs.PathError: it names the call and the path
	}
	return c.reply(info)
}

func (s *server) stat(c *conn, req *proto.Request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	info, err := lstatInfo(path)
	if err != nil {
		return err // an *fs.PathError: it names the call and the path
	}
	return c.reply(info)
}

// listBatch is how many entries go into one Result frame of a listing.
const listBatch = 512

func (s *server) list(c *conn, req *proto.Request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("listing %s: %w", path, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return fmt.Errorf("listing %s: %w", path, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: %w", path, errdefs.ErrInvalidArgument)
	}
	for {
		entries, err := f.ReadDir(listBatch)
		batch := make([]api.FileInfo, 0, len(entries))
		for _, e := range entries {
			fi, ierr := e.Info()
			if ierr != nil {
				continue // removed meanwhile
			}
			batch = append(batch, fileInfo(filepath.Join(path, e.Name()), fi))
		}
		if len(batch) > 0 {
			if werr := proto.WriteJSONFrame(c.bw, proto.FrameResult, batch); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(entries) == 0) {
			break
		}
		if err != nil {
			return fmt.Errorf("listing %s: %w", path, err)
		}
	}
	if err := c.frame(proto.FrameEOF, nil); err != nil {
		return err
	}
	return c.bw.Flush()
}

func (s *server) mkdir(c *conn, req *proto.Request) error {
	if req.Mkdir == nil {
		return fmt.Errorf("mkdir without request: %w", errdefs.ErrInvalidArgument)
	}
	path, err := cleanPath(req.Mkdir.Path)
	if err != nil {
		return err
	}
	mode := req.Mkdir.Mode
	if mode == 0 {
		mode = 0o755
	}
	if mode&^0o7777 != 0 {
		return fmt.Errorf("mode %o: %w", mode, errdefs.ErrInvalidArgument)
	}
	owner, err := s.owner(req.Owner)
	if err != nil {
		return err
	}
	if req.Mkdir.Parents {
		if fi, err := os.Lstat(path); err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s exists and is not a directory: %w", path, errdefs.ErrAlreadyExists)
			}
			return c.reply(fileInfo(path, fi))
		}
		if err := mkdirAllOwned(path, owner); err != nil {
			return fmt.Errorf("mkdir %s: %w", path, err)
		}
	} else if err := os.Mkdir(path, 0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	} else if owner != nil {
		if err := os.Lchown(path, int(owner.uid), int(owner.gid)); err != nil {
			return fmt.Errorf("chown %s: %w", path, err)
		}
	}
	if err := os.Chmod(path, fileMode(mode)); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	info, err := lstatInfo(path)
	if err != nil {
		return err // an *fs.PathError: it names the call and the path
	}
	return c.reply(info)
}

func (s *server) move(c *conn, req *proto.Request) error {
	if req.Move == nil {
		return fmt.Errorf("move without request: %w", errdefs.ErrInvalidArgument)
	}
	from, err := cleanPath(req.Move.From)
	if err != nil {
		return fmt.Errorf("from: %w", err)
	}
	to, err := cleanPath(req.Move.To)
	if err != nil {
		return fmt.Errorf("to: %w", err)
	}
	if from == "/" || to == "/" {
		return fmt.Errorf("cannot move /: %w", errdefs.ErrInvalidArgument)
	}
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("moving %s to %s: %w", from, to, err)
	}
	return c.reply(nil)
}

func (s *server) remove(c *conn, req *proto.Request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	if path == "/" {
		return fmt.Errorf("cannot remove /: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := os.Lstat(path); err != nil {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	if req.Recursive {
		err = os.RemoveAll(path)
	} else {
		err = os.Remove(path)
	}
	if err != nil {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return c.reply(nil)
}

// owner resolves a request's Owner in the sandbox's /etc; nil for "".
func (s *server) owner(spec string) (*account, error) {
	if spec == "" {
		return nil, nil
	}
	acct, err := lookupAccount(s.etc, spec)
	if err != nil {
		return nil, fmt.Errorf("owner %q: %w", spec, err)
	}
	return &acct, nil
}

// mkdirAllOwned is os.MkdirAll(dir, 0755) that gives the directories it
// creates to owner (nil: leaves them root's).
func mkdirAllOwned(dir string, owner *account) error {
	var made []string
	for p := dir; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil || p == "/" || p == "." {
			break
		}
		made = append(made, p)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if owner == nil {
		return nil
	}
	for _, p := range made {
		if err := os.Lchown(p, int(owner.uid), int(owner.gid)); err != nil {
			return err
		}
	}
	return nil
}
