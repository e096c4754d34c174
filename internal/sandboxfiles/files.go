// Package sandboxfiles serves the file and process operations of a
// sandbox that are each one call to its guest: read, write, stat, list,
// mkdir, move, remove, tar archives out and in, the process list, stdin,
// signals and terminal resize. It sits above the sandbox core and reaches
// a guest only through the core's WithGuest, so every operation here wakes
// a sleeping sandbox, holds its operation lock shared while the guest
// answers and is seen by the core's observers as sandbox.OpGuestCall with
// the detail each method documents.
//
// File operations run inside the sandbox, through its guest: the daemon
// never resolves a sandbox path on the host, so a symlink planted inside a
// sandbox can only ever point into that sandbox.
package sandboxfiles

import (
	"context"
	"fmt"
	"io"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Guests is what Files needs of the sandbox core; *sandbox.Manager (and
// every sandbox.Core) implements it.
type Guests interface {
	// WithGuest runs fn against sandbox id's guest (sandbox.Manager.WithGuest).
	WithGuest(ctx context.Context, id, op string, fn func(g *client.Client) error) error
}

var (
	_ Guests = (*sandbox.Manager)(nil)
	_ Guests = (sandbox.Core)(nil) // features reach it from Provision
)

// Files is the guest file and process API of every sandbox. It holds no
// state of its own: it is safe for concurrent use, and the concurrency
// and errors of each call are those of Guests.WithGuest (ErrNotFound for a
// sandbox the caller of ctx cannot see; the guest's error wrapped with
// the operation and the sandbox id).
type Files struct {
	g Guests
}

// New returns the API over g's sandboxes.
func New(g Guests) *Files { return &Files{g: g} }

// ReadFile opens a file for streaming (observed as "reading <path>"). The
// caller closes the reader.
func (f *Files) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, api.FileInfo, error) {
	var (
		rc   io.ReadCloser
		info api.FileInfo
	)
	err := f.g.WithGuest(ctx, id, "reading "+path, func(g *client.Client) (err error) {
		rc, info, err = g.ReadFile(ctx, path)
		return err
	})
	return rc, info, err
}

// WriteFile streams r into a file, replacing it atomically (observed as
// "writing <path>").
func (f *Files) WriteFile(ctx context.Context, id, path string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error) {
	return f.WriteFileAs(ctx, id, path, "", mode, parents, r)
}

// WriteFileAs is WriteFile with the file and the parents it makes owned
// by owner, a user of the sandbox ("" is root).
func (f *Files) WriteFileAs(ctx context.Context, id, path, owner string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error) {
	var info api.FileInfo
	err := f.g.WithGuest(ctx, id, "writing "+path, func(g *client.Client) (err error) {
		info, err = g.WriteFileAs(ctx, path, owner, mode, parents, r)
		return err
	})
	return info, err
}

// Stat describes one path, symlinks not followed (observed as
// "stat <path>").
func (f *Files) Stat(ctx context.Context, id, path string) (api.FileInfo, error) {
	var info api.FileInfo
	err := f.g.WithGuest(ctx, id, "stat "+path, func(g *client.Client) (err error) {
		info, err = g.Stat(ctx, path)
		return err
	})
	return info, err
}

// List lists a directory (observed as "listing <path>").
func (f *Files) List(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	var out []api.FileInfo
	err := f.g.WithGuest(ctx, id, "listing "+path, func(g *client.Client) (err error) {
		out, err = g.List(ctx, path)
		return err
	})
	return out, err
}

// Mkdir creates a directory (observed as "creating directory <path>").
func (f *Files) Mkdir(ctx context.Context, id string, req api.MkdirRequest) (api.FileInfo, error) {
	return f.MkdirAs(ctx, id, "", req)
}

// MkdirAs is Mkdir with the directory and the parents it makes owned by
// owner, a user of the sandbox ("" is root).
func (f *Files) MkdirAs(ctx context.Context, id, owner string, req api.MkdirRequest) (api.FileInfo, error) {
	var info api.FileInfo
	err := f.g.WithGuest(ctx, id, "creating directory "+req.Path, func(g *client.Client) (err error) {
		info, err = g.MkdirAs(ctx, owner, req)
		return err
	})
	return info, err
}

// Move renames a path (observed as "moving <from> to <to>").
func (f *Files) Move(ctx context.Context, id string, req api.MoveRequest) error {
	return f.g.WithGuest(ctx, id, fmt.Sprintf("moving %s to %s", req.From, req.To), func(g *client.Client) error {
		return g.Move(ctx, req)
	})
}

// Remove removes a path, recursively when asked (observed as
// "removing <path>").
func (f *Files) Remove(ctx context.Context, id, path string, recursive bool) error {
	return f.g.WithGuest(ctx, id, "removing "+path, func(g *client.Client) error {
		return g.Remove(ctx, path, recursive)
	})
}

// ReadArchive streams a directory as a tar archive (observed as
// "archiving <path>"). The caller closes the reader.
func (f *Files) ReadArchive(ctx context.Context, id, path string) (io.ReadCloser, error) {
	var rc io.ReadCloser
	err := f.g.WithGuest(ctx, id, "archiving "+path, func(g *client.Client) (err error) {
		rc, err = g.ReadArchive(ctx, path)
		return err
	})
	return rc, err
}

// WriteArchive extracts a tar stream under a directory (observed as
// "extracting into <path>").
func (f *Files) WriteArchive(ctx context.Context, id, path string, r io.Reader) error {
	return f.g.WithGuest(ctx, id, "extracting into "+path, func(g *client.Client) error {
		return g.WriteArchive(ctx, path, r)
	})
}

// Watch watches directory path (recursive: its subdirectories too) for
// changes, through the guest's inotify (observed as "watching <path>").
// The stream outlives the call: it holds no lock of the sandbox, ends
// when ctx is done or the caller closes it, and ends with an error when
// the guest goes away (the sandbox is hibernated or deleted); a paused
// sandbox's stream simply waits.
func (f *Files) Watch(ctx context.Context, id, path string, recursive bool) (*client.Watch, error) {
	var w *client.Watch
	err := f.g.WithGuest(ctx, id, "watching "+path, func(g *client.Client) (err error) {
		w, err = g.Watch(ctx, path, recursive)
		return err
	})
	return w, err
}
