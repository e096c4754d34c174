package e2b

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The filesystem.Filesystem service over agentbox's files calls. Paths
// resolve against the user's home (resolvePath); the calls themselves
// act as the sandbox's root, so files and directories made here are
// root's (docs/E2B.md).

const filesystemService = "/filesystem.Filesystem/"

// Messages of filesystem.Filesystem (envd's filesystem.proto), in their
// protobuf JSON form.

// fileType is filesystem.FileType, sent by name.
type fileType string

const (
	fileTypeUnspecified fileType = "FILE_TYPE_UNSPECIFIED"
	fileTypeFile        fileType = "FILE_TYPE_FILE"
	fileTypeDirectory   fileType = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink     fileType = "FILE_TYPE_SYMLINK"
)

type entryInfo struct {
	Name          string     `json:"name"`
	Type          fileType   `json:"type"`
	Path          string     `json:"path"`
	Size          string     `json:"size"` // int64: a string in protobuf JSON
	Mode          uint32     `json:"mode"`
	Permissions   string     `json:"permissions"`
	Owner         string     `json:"owner"`
	Group         string     `json:"group"`
	ModifiedTime  *time.Time `json:"modifiedTime,omitempty"`
	SymlinkTarget *string    `json:"symlinkTarget,omitempty"`
}

type pathRequest struct {
	Path string `json:"path"`
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type entryResponse struct {
	Entry *entryInfo `json:"entry"`
}

type listDirResponse struct {
	Entries []*entryInfo `json:"entries"`
}

// maxListDepth bounds ListDir's depth.
const maxListDepth = 16

func (s *Server) filesystemRoutes(mux *http.ServeMux, opts []connect.HandlerOption) {
	mux.Handle(filesystemService+"Stat", connect.NewUnaryHandler(filesystemService+"Stat", s.stat, opts...))
	mux.Handle(filesystemService+"MakeDir", connect.NewUnaryHandler(filesystemService+"MakeDir", s.makeDir, opts...))
	mux.Handle(filesystemService+"Move", connect.NewUnaryHandler(filesystemService+"Move", s.move, opts...))
	mux.Handle(filesystemService+"ListDir", connect.NewUnaryHandler(filesystemService+"ListDir", s.listDir, opts...))
	mux.Handle(filesystemService+"Remove", connect.NewUnaryHandler(filesystemService+"Remove", s.remove, opts...))
}

// entryOf maps agentbox's FileInfo to an EntryInfo.
func entryOf(fi api.FileInfo) *entryInfo {
	e := &entryInfo{
		Name:  fi.Name,
		Path:  fi.Path,
		Size:  strconv.FormatInt(fi.Size, 10),
		Mode:  fi.Mode,
		Owner: userName(fi.UID),
		Group: userName(fi.GID),
	}
	mode := fs.FileMode(fi.Mode & 0o777)
	switch fi.Type {
	case "file":
		e.Type = fileTypeFile
	case "dir", "directory":
		e.Type = fileTypeDirectory
		mode |= fs.ModeDir
	case "symlink":
		e.Type = fileTypeSymlink
		mode |= fs.ModeSymlink
		if fi.LinkTarget != "" {
			t := fi.LinkTarget
			e.SymlinkTarget = &t
		}
	default:
		e.Type = fileTypeUnspecified
	}
	e.Permissions = mode.String()
	if !fi.ModTime.IsZero() {
		t := fi.ModTime.UTC()
		e.ModifiedTime = &t
	}
	return e
}

// userName names the ids of E2B's convention; others are numbers.
func userName(id int) string {
	switch id {
	case 0:
		return "root"
	case 1000:
		return DefaultUser
	}
	return strconv.Itoa(id)
}

// fsPath resolves a request path for the user of the request.
func fsPath(h http.Header, p string) (string, error) {
	user, err := userOfHeader(h)
	if err != nil {
		return "", err
	}
	return resolvePath(p, user)
}

func (s *Server) stat(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[entryResponse], error) {
	p, err := fsPath(req.Header(), req.Msg.Path)
	if err != nil {
		return nil, connectError(err)
	}
	fi, err := s.sb.Stat(ctx, sandboxFrom(ctx), p)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&entryResponse{Entry: entryOf(fi)}), nil
}

func (s *Server) makeDir(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[entryResponse], error) {
	user, err := userOfHeader(req.Header())
	if err != nil {
		return nil, connectError(err)
	}
	p, err := resolvePath(req.Msg.Path, user)
	if err != nil {
		return nil, connectError(err)
	}
	id := sandboxFrom(ctx)
	if _, err := s.sb.Stat(ctx, id, p); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s already exists", p))
	} else if !errdefs.IsNotFound(err) {
		return nil, connectError(err)
	}
	mreq := api.MkdirRequest{Path: p, Mode: 0o755, Parents: true}
	var fi api.FileInfo
	if o, ok := s.sb.(Owners); ok && user != "root" {
		fi, err = o.MkdirAs(ctx, id, user, mreq)
	} else {
		fi, err = s.sb.Mkdir(ctx, id, mreq)
	}
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&entryResponse{Entry: entryOf(fi)}), nil
}

func (s *Server) move(ctx context.Context, req *connect.Request[moveRequest]) (*connect.Response[entryResponse], error) {
	from, err := fsPath(req.Header(), req.Msg.Source)
	if err != nil {
		return nil, connectError(err)
	}
	to, err := fsPath(req.Header(), req.Msg.Destination)
	if err != nil {
		return nil, connectError(err)
	}
	id := sandboxFrom(ctx)
	if err := s.sb.Move(ctx, id, api.MoveRequest{From: from, To: to}); err != nil {
		return nil, connectError(err)
	}
	fi, err := s.sb.Stat(ctx, id, to)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&entryResponse{Entry: entryOf(fi)}), nil
}

func (s *Server) listDir(ctx context.Context, req *connect.Request[listDirRequest]) (*connect.Response[listDirResponse], error) {
	p, err := fsPath(req.Header(), req.Msg.Path)
	if err != nil {
		return nil, connectError(err)
	}
	depth := int(max(req.Msg.Depth, 1))
	if depth > maxListDepth {
		return nil, connectError(fmt.Errorf("depth %d: at most %d: %w", depth, maxListDepth, errdefs.ErrInvalidArgument))
	}
	id := sandboxFrom(ctx)
	fi, err := s.sb.Stat(ctx, id, p)
	if err != nil {
		return nil, connectError(err)
	}
	if fi.Type != "dir" && fi.Type != "directory" {
		return nil, connectError(fmt.Errorf("%s is not a directory: %w", p, errdefs.ErrInvalidArgument))
	}
	out := &listDirResponse{Entries: []*entryInfo{}}
	if err := s.walk(ctx, id, p, depth, &out.Entries); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(out), nil
}

// walk appends the entries of dir, and of its subdirectories down to
// depth levels (symlinks are not followed).
func (s *Server) walk(ctx context.Context, id, dir string, depth int, out *[]*entryInfo) error {
	fis, err := s.sb.List(ctx, id, dir)
	if err != nil {
		return err
	}
	for _, fi := range fis {
		if fi.Path == "" {
			fi.Path = path.Join(dir, fi.Name)
		}
		*out = append(*out, entryOf(fi))
		if depth > 1 && (fi.Type == "dir" || fi.Type == "directory") {
			if err := s.walk(ctx, id, fi.Path, depth-1, out); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return err
			}
		}
	}
	return nil
}

func (s *Server) remove(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[empty], error) {
	p, err := fsPath(req.Header(), req.Msg.Path)
	if err != nil {
		return nil, connectError(err)
	}
	if err := s.sb.Remove(ctx, sandboxFrom(ctx), p, true); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&empty{}), nil
}
