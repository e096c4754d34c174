// Package httpapi is the daemon's HTTP edge: routes of API v1 (see
// docs/CONTRACTS.md and api/openapi.yaml), input validation, authentication,
// DNS-rebinding defences, NDJSON streaming, and the one place where error
// categories (internal/errdefs) become HTTP statuses.
//
// Business logic lives behind Service (implemented by internal/sandbox). The
// handlers only parse, validate, call one Service method and encode; they
// return their errors, and handle (errors.go) is the one place that turns
// an error into the response and the request's log line.
package httpapi

import (
	"context"
	"io"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
)

// Service is the daemon core as seen by the HTTP edge.
//
// Contract for every method:
//   - Methods are called concurrently from many requests and must be safe for
//     concurrent use.
//   - ctx is the request's context: it is cancelled when the client goes
//     away or the daemon shuts down. A method that starts work which must
//     outlive the request (a background process, a sandbox being created)
//     detaches it itself (context.WithoutCancel).
//   - Arguments have been validated for shape by the edge: sandbox ids match
//     ^[a-z0-9][a-z0-9-]{0,63}$, pids are positive, file paths are absolute,
//     at most 4096 bytes and free of NUL bytes, JSON bodies carried no unknown
//     fields. Semantic checks (does the template exist, is the sandbox
//     running) are the Service's.
//   - Errors wrap an errdefs sentinel to choose the status. The text of
//     4xx-category errors is shown to the client verbatim, so it must not
//     contain host paths or other internal detail; errors of no category
//     (or ErrInternal) become a 500 whose text is only logged.
//   - A well-formed id of no sandbox is errdefs.ErrNotFound.
type Service interface {
	// Info describes the daemon (version, backend, capabilities).
	Info(ctx context.Context) (api.Info, error)

	// CreateSandbox creates and starts a sandbox and returns it running.
	CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	// ListSandboxes returns the sandboxes whose labels include every
	// key/value of labels (nil or empty: all sandboxes).
	ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	// ResolveSandbox returns the id of the sandbox ref designates for the
	// caller of ctx: ref when it is a sandbox id, else the id of the
	// caller's sandbox named ref. A ref of neither is returned unchanged
	// (the call it is then passed to reports it not found). The edge
	// resolves every {id} path value through it, so every route that
	// takes a sandbox id takes its name too.
	ResolveSandbox(ctx context.Context, ref string) string
	// GetSandbox returns one sandbox.
	GetSandbox(ctx context.Context, id string) (api.Sandbox, error)
	// DeleteSandbox destroys a sandbox and everything it holds.
	DeleteSandbox(ctx context.Context, id string) error

	// Exec runs a process and returns its event stream, which starts with
	// an api.EventStarted event. req.Background is false. When the client
	// goes away the edge closes the stream; the process keeps running (its
	// own timeout still applies) and can be re-attached.
	Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error)
	// StartProcess runs a process in the background (req.Background is true)
	// and returns as soon as it has started.
	StartProcess(ctx context.Context, id string, req api.ExecRequest) (api.Process, error)
	// Attach streams the output of a running or finished process. With
	// replay, buffered earlier output is sent first. The stream ends with
	// the process's exit event.
	Attach(ctx context.Context, id string, pid int, replay bool) (execstream.Stream, error)
	// ListProcesses lists the processes started through Exec/StartProcess.
	ListProcesses(ctx context.Context, id string) ([]api.Process, error)
	// WriteStdin copies r (a streamed request body of any size) to the
	// process's stdin; with closeAfter, stdin is closed when r is drained.
	WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error
	// Signal sends sig ("TERM", "KILL", ... or a number) to the process.
	Signal(ctx context.Context, id string, pid int, sig string) error
	// Resize changes the size of the process's terminal.
	Resize(ctx context.Context, id string, pid int, tty api.TTY) error

	// ReadFile opens a regular file. The caller closes the reader. The
	// returned FileInfo's Size is sent as Content-Length: the reader must
	// yield exactly that many bytes or the response is cut short.
	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, api.FileInfo, error)
	// WriteFile atomically replaces path with the content of r (a streamed
	// request body, never buffered by the edge) and permission bits mode
	// (the edge defaults it to 0644). With parents, missing directories are
	// created. If reading r fails with *http.MaxBytesError the upload was
	// over the configured limit; the Service must wrap, not replace, that
	// error.
	WriteFile(ctx context.Context, id, path string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error)
	// Stat describes path without following a final symlink.
	Stat(ctx context.Context, id, path string) (api.FileInfo, error)
	// List returns the entries of directory path.
	List(ctx context.Context, id, path string) ([]api.FileInfo, error)
	// Mkdir creates a directory (req.Path validated like every path).
	Mkdir(ctx context.Context, id string, req api.MkdirRequest) (api.FileInfo, error)
	// Move renames req.From to req.To.
	Move(ctx context.Context, id string, req api.MoveRequest) error
	// Remove deletes path; a non-empty directory needs recursive.
	Remove(ctx context.Context, id, path string, recursive bool) error
	// ReadArchive returns directory path as a tar stream with entries
	// relative to path. The caller closes it.
	ReadArchive(ctx context.Context, id, path string) (io.ReadCloser, error)
	// WriteArchive extracts the tar stream r under directory path (created
	// if missing). Entries escaping path are rejected.
	WriteArchive(ctx context.Context, id, path string, r io.Reader) error

	// ListTemplates lists builtin, registered and built templates.
	ListTemplates(ctx context.Context) ([]api.Template, error)
	// GetTemplate returns one template.
	GetTemplate(ctx context.Context, name string) (api.Template, error)
	// BuildTemplate builds (or finds cached) a template. progress receives
	// step and log events only, sequentially, never after BuildTemplate
	// returns; the edge itself ends the stream with a done or error event.
	// ctx is cancelled when the client goes away.
	BuildTemplate(ctx context.Context, req api.BuildTemplateRequest, progress func(api.BuildEvent)) (api.Template, error)
}
