package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// The terminal: GET /v1/sandboxes/{id}/terminal upgrades to a WebSocket
// carrying an interactive shell on a PTY (the web console's terminal,
// docs/CONSOLE.md). It is the exec path of POST .../exec with a TTY and an
// open stdin, framed for a browser:
//
//   - client to server: binary messages are keystrokes (the PTY's input);
//     text messages are JSON controls, {"type":"resize","cols":C,"rows":R}.
//   - server to client: binary messages are the PTY's output; one text
//     message {"type":"exit","exit_code":N} or {"type":"error","error":S}
//     ends the session, then the socket closes.
//
// A browser cannot set an Authorization header on a WebSocket, so the key
// may instead travel as a subprotocol, "agentbox.bearer.<base64url key>"
// beside TerminalProtocol (see wsBearer); the server answers with
// TerminalProtocol only, never echoing the key. Closing the socket closes
// stdin and hangs the shell up.

// TerminalProtocol is the WebSocket subprotocol of the terminal route.
const TerminalProtocol = "agentbox.terminal.v1"

// wsBearerPrefix prefixes the API key sent as a WebSocket subprotocol.
const wsBearerPrefix = "agentbox.bearer."

// wsBearer returns the API key a WebSocket handshake carries in
// Sec-WebSocket-Protocol, if any.
func wsBearer(r *http.Request) (string, bool) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return "", false
	}
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			p = strings.TrimSpace(p)
			if rest, ok := strings.CutPrefix(p, wsBearerPrefix); ok {
				// Only the canonical spelling: decoding alone skips
				// newlines and, unless strict, trailing bits.
				key, err := base64.RawURLEncoding.Strict().DecodeString(rest)
				if err != nil || len(key) == 0 || base64.RawURLEncoding.EncodeToString(key) != rest {
					return "", false
				}
				return string(key), true
			}
		}
	}
	return "", false
}

// maxTerminalMessage bounds one client message (keystrokes or a control).
const maxTerminalMessage = 64 << 10

func (h *handler) terminalRoutes() []route {
	return []route{{"GET", "/v1/sandboxes/{id}/terminal", h.terminal}}
}

// terminalControl is a text message from the client.
type terminalControl struct {
	Type string `json:"type"`
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

func (h *handler) terminal(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	// A GET by method, but it runs a shell: read-only keys may not.
	if !tenant.From(r.Context()).CanWrite() {
		return fmt.Errorf("this API key is read-only: %w", errdefs.ErrPermissionDenied)
	}
	tty := api.TTY{Rows: 24, Cols: 80}
	for name, dst := range map[string]*uint16{"rows": &tty.Rows, "cols": &tty.Cols} {
		if s := r.URL.Query().Get(name); s != "" {
			v, err := strconv.ParseUint(s, 10, 16)
			if err != nil || v == 0 || v > 1000 {
				return errorf("%s=%q: want 1 to 1000", name, clip(s))
			}
			*dst = uint16(v)
		}
	}
	// Another tenant's sandbox is not found, whatever else is wrong with
	// the request: the same answer as an unknown id.
	if _, err := h.svc.GetSandbox(r.Context(), id); err != nil {
		return err
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return errorf("GET %s needs a WebSocket upgrade", r.URL.Path)
	}
	ctx := r.Context()
	stream, err := h.svc.Exec(ctx, id, api.ExecRequest{
		Cmd:       []string{"/bin/sh"},
		Env:       map[string]string{"TERM": "xterm"},
		TTY:       &tty,
		StdinOpen: true,
	})
	if err != nil {
		return err
	}
	defer stream.Close()
	first, err := stream.Next()
	if err != nil {
		return fmt.Errorf("starting the terminal's shell: %w", err)
	}
	if first.Type != api.EventStarted {
		if first.Type == api.EventError {
			return fmt.Errorf("starting the terminal's shell: %s: %w", first.Error, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("starting the terminal's shell: got %q first: %w", first.Type, errdefs.ErrInternal)
	}
	pid := first.Pid
	// The Origin was checked by checkAccess (same origin, or an allowed
	// host); the library's own check would refuse an allowed other host.
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols:       []string{TerminalProtocol},
		InsecureSkipVerify: true,
	})
	if err != nil {
		// Accept has answered the client; the shell is hung up below.
		_ = h.svc.Signal(context.WithoutCancel(ctx), id, pid, "HUP")
		return nil
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxTerminalMessage)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Keystrokes flow through a pipe into one long stdin upload.
	pr, pw := io.Pipe()
	go func() {
		err := h.svc.WriteStdin(ctx, id, pid, pr, true)
		pr.CloseWithError(err)
	}()
	go func() {
		defer pw.Close()
		for {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				// The browser went away: hang the shell up.
				_ = h.svc.Signal(context.WithoutCancel(ctx), id, pid, "HUP")
				cancel()
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := pw.Write(data); err != nil {
					return
				}
				continue
			}
			var c terminalControl
			if json.Unmarshal(data, &c) == nil && c.Type == "resize" && c.Rows > 0 && c.Cols > 0 {
				_ = h.svc.Resize(ctx, id, pid, api.TTY{Rows: c.Rows, Cols: c.Cols})
			}
		}
	}()
	go func() {
		<-ctx.Done()
		_ = stream.Close() // unblocks Next
	}()
	for {
		ev, err := stream.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			_ = conn.Close(websocket.StatusInternalError, "stream ended")
			return nil
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			if err := conn.Write(ctx, websocket.MessageBinary, ev.Data); err != nil {
				return nil
			}
		case api.EventExit:
			msg, _ := json.Marshal(map[string]any{"type": "exit", "exit_code": ev.ExitCode})
			_ = conn.Write(ctx, websocket.MessageText, msg)
		case api.EventError:
			msg, _ := json.Marshal(map[string]any{"type": "error", "error": ev.Error})
			_ = conn.Write(ctx, websocket.MessageText, msg)
		}
	}
	_ = conn.Close(websocket.StatusNormalClosure, "")
	return nil
}
