package sandbox

import (
	"context"
	"fmt"
	"io"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/guest/client"
)

// File operations run inside the sandbox, through its guest: the daemon
// never resolves a sandbox path on the host, so a symlink planted inside a
// sandbox can only ever point into that sandbox.

// ReadFile opens a file for streaming. The caller closes the reader.
func (m *Manager) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, api.FileInfo, error) {
	var (
		rc   io.ReadCloser
		info api.FileInfo
	)
	err := m.withGuest(ctx, id, "reading "+path, func(g *client.Client) (err error) {
		rc, info, err = g.ReadFile(ctx, path)
		return err
	})
	return rc, info, err
}

// WriteFile streams r into a file, replacing it atomically.
func (m *Manager) WriteFile(ctx context.Context, id, path string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error) {
	var info api.FileInfo
	err := m.withGuest(ctx, id, "writing "+path, func(g *client.Client) (err error) {
		info, err = g.WriteFile(ctx, path, mode, parents, r)
		return err
	})
	return info, err
}

// Stat describes one path (symlinks are not followed).
func (m *Manager) Stat(ctx context.Context, id, path string) (api.FileInfo, error) {
	var info api.FileInfo
	err := m.withGuest(ctx, id, "stat "+path, func(g *client.Client) (err error) {
		info, err = g.Stat(ctx, path)
		return err
	})
	return info, err
}

// List lists a directory.
func (m *Manager) List(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	var out []api.FileInfo
	err := m.withGuest(ctx, id, "listing "+path, func(g *client.Client) (err error) {
		out, err = g.List(ctx, path)
		return err
	})
	return out, err
}

// Mkdir creates a directory.
func (m *Manager) Mkdir(ctx context.Context, id string, req api.MkdirRequest) (api.FileInfo, error) {
	var info api.FileInfo
	err := m.withGuest(ctx, id, "creating directory "+req.Path, func(g *client.Client) (err error) {
		info, err = g.Mkdir(ctx, req)
		return err
	})
	return info, err
}

// Move renames a path.
func (m *Manager) Move(ctx context.Context, id string, req api.MoveRequest) error {
	return m.withGuest(ctx, id, fmt.Sprintf("moving %s to %s", req.From, req.To), func(g *client.Client) error {
		return g.Move(ctx, req)
	})
}

// Remove removes a path, recursively when asked.
func (m *Manager) Remove(ctx context.Context, id, path string, recursive bool) error {
	return m.withGuest(ctx, id, "removing "+path, func(g *client.Client) error {
		return g.Remove(ctx, path, recursive)
	})
}

// ReadArchive streams a directory as a tar archive.
func (m *Manager) ReadArchive(ctx context.Context, id, path string) (io.ReadCloser, error) {
	var rc io.ReadCloser
	err := m.withGuest(ctx, id, "archiving "+path, func(g *client.Client) (err error) {
		rc, err = g.ReadArchive(ctx, path)
		return err
	})
	return rc, err
}

// WriteArchive extracts a tar stream under a directory.
func (m *Manager) WriteArchive(ctx context.Context, id, path string, r io.Reader) error {
	return m.withGuest(ctx, id, "extracting into "+path, func(g *client.Client) error {
		return g.WriteArchive(ctx, path, r)
	})
}
