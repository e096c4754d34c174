// Package proto is the wire protocol between the host-side guest client
// (internal/guest/client) and the in-sandbox guest server (internal/guest).
//
// One operation is one unix stream connection. The client opens it and sends
// a request header: a 4-byte big-endian length followed by that many bytes of
// JSON (a Request, at most MaxHeader bytes). After the header both sides
// exchange typed binary frames:
//
//	[type byte][length uint32 big-endian][payload, at most MaxFrame bytes]
//
// Which frames flow in which direction is fixed per operation (see the Op*
// constants). Every operation ends with exactly one terminal frame from the
// server: FrameResult (JSON reply), FrameExit (exec/attach), FrameEOF
// (streams of data) or FrameError (JSON Error). After FrameError the server
// closes the connection.
//
// The server is untrusted by the client: a sandboxed user can replace it.
// Every reader here enforces the size limits before allocating, and the
// client validates every value it decodes.
package proto

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Version is the protocol version sent in every request. The server rejects
// requests of another version with an invalid_argument error.
const Version = 1

// Limits.
const (
	MaxHeader = 1 << 20 // request header JSON
	MaxFrame  = 1 << 20 // frame payload
	// ChunkSize is the payload size senders use for bulk data; receivers
	// must accept anything up to MaxFrame.
	ChunkSize = 64 << 10
	// MaxPathLen is the longest path accepted by file operations.
	MaxPathLen = 4096
)

// FrameType is the first byte of a frame.
type FrameType byte

// Frame types. Direction: C = client to server, S = server to client.
const (
	FrameStdin      FrameType = 'i' // C: raw bytes for the process's stdin
	FrameCloseStdin FrameType = 'c' // C: close the process's stdin; empty
	FrameResize     FrameType = 'r' // C: JSON api.TTY
	FrameSignal     FrameType = 'k' // C: signal name or number as text
	FrameData       FrameType = 'd' // C/S: raw file or tar bytes
	FrameEOF        FrameType = 'z' // C/S: end of a data stream; empty
	FrameStarted    FrameType = 's' // S: JSON Started
	FrameStdout     FrameType = 'o' // S: raw output (merged output with a TTY)
	FrameStderr     FrameType = 'e' // S: raw output
	FrameExit       FrameType = 'x' // S: JSON Exit; terminal
	FrameResult     FrameType = 'R' // S: JSON reply of the operation; terminal unless the op says otherwise
	FrameError      FrameType = 'E' // S: JSON Error; terminal
)

// Valid reports whether t is a known frame type.
func (t FrameType) Valid() bool {
	switch t {
	case FrameStdin, FrameCloseStdin, FrameResize, FrameSignal, FrameData, FrameEOF,
		FrameStarted, FrameStdout, FrameStderr, FrameExit, FrameResult, FrameError:
		return true
	}
	return false
}

func (t FrameType) String() string {
	if t.Valid() {
		return string(rune(t))
	}
	return fmt.Sprintf("0x%02x", byte(t))
}

// Operations. The comment gives the frames after the header.
const (
	// OpVersion: S Result(VersionReply).
	OpVersion = "version"
	// OpExec: S Started, then Stdout/Stderr..., then Exit (or Error at any
	// point). C may send Stdin, CloseStdin, Resize, Signal meanwhile.
	OpExec = "exec"
	// OpStart: S Result(api.Process). The process runs in the background.
	OpStart = "start"
	// OpAttach: like OpExec after the process was started; with Replay the
	// buffered output is sent first.
	OpAttach = "attach"
	// OpProcesses: S Result([]api.Process).
	OpProcesses = "processes"
	// OpActivity: S Result(ActivityReply). Guests before it answer
	// ErrNotImplemented.
	OpActivity = "activity"
	// OpStdin: C Stdin... then EOF; S Result(null). CloseStdin in the
	// request closes the process's stdin after the data.
	OpStdin = "stdin"
	// OpSignal: S Result(null).
	OpSignal = "signal"
	// OpResize: S Result(null).
	OpResize = "resize"
	// OpReadFile: S Result(api.FileInfo), Data... (exactly Size bytes), EOF.
	OpReadFile = "read_file"
	// OpWriteFile: C Data... then EOF; S Result(api.FileInfo). The server
	// may answer Error before the client finished sending.
	OpWriteFile = "write_file"
	// OpStat: S Result(api.FileInfo).
	OpStat = "stat"
	// OpList: S Result([]api.FileInfo)... (any number of batches), EOF.
	OpList = "list"
	// OpMkdir: S Result(api.FileInfo).
	OpMkdir = "mkdir"
	// OpMove: S Result(null).
	OpMove = "move"
	// OpRemove: S Result(null).
	OpRemove = "remove"
	// OpReadArchive: S Data... (a tar stream), EOF.
	OpReadArchive = "read_archive"
	// OpWriteArchive: C Data... (a tar stream) then EOF; S Result(null).
	OpWriteArchive = "write_archive"
	// OpWatch: S Result(null) once Path (a directory; with Recursive its
	// subdirectories too, and those made later) is watched, then one
	// Result(api.FSEvent) per change, until the client closes the
	// connection; Error at any point is terminal (events were lost:
	// ErrResourceExhausted).
	OpWatch = "watch"
	// OpTunnel: S Result(null) once the guest listens on 127.0.0.1:<port>
	// inside the sandbox for every port in Request.Ports; from then on the
	// connection carries a yamux session (the guest is the yamux client).
	// For each connection accepted on an inside listener the guest opens a
	// stream whose first 2 bytes are that port, big-endian, followed by the
	// connection's bytes in both directions. A later tunnel operation
	// replaces the session (and closes listeners of ports it does not name).
	// See internal/guest/tunnel.go.
	OpTunnel = "tunnel"
	// OpDial: the guest connects to 127.0.0.1:<Request.Port> inside the
	// sandbox; S Result(null) once connected (Error when it cannot: the
	// port is not listening is errdefs.ErrUnavailable). From then on the
	// connection carries that TCP connection's bytes in both directions,
	// unframed; a half-close on either side is passed on. It is how the
	// host reaches a service inside a sandbox (internal/serviceurl),
	// which has no route from the host.
	OpDial = "dial"
)

// MaxTunnelPorts bounds Request.Ports of OpTunnel.
const MaxTunnelPorts = 16

// Request is the header of every connection.
type Request struct {
	V  int    `json:"v"`
	Op string `json:"op"`

	Exec       *api.ExecRequest  `json:"exec,omitempty"`        // exec, start
	Pid        int               `json:"pid,omitempty"`         // attach, stdin, signal, resize
	Replay     bool              `json:"replay,omitempty"`      // attach
	CloseStdin bool              `json:"close_stdin,omitempty"` // stdin
	Signal     string            `json:"signal,omitempty"`      // signal
	TTY        *api.TTY          `json:"tty,omitempty"`         // resize
	Path       string            `json:"path,omitempty"`        // file operations
	Mode       uint32            `json:"mode,omitempty"`        // write_file
	Parents    bool              `json:"parents,omitempty"`     // write_file
	Recursive  bool              `json:"recursive,omitempty"`   // remove, watch
	Mkdir      *api.MkdirRequest `json:"mkdir,omitempty"`       // mkdir
	// Owner ("name", "uid" or "name:group", resolved in the sandbox's
	// /etc) owns what write_file and mkdir create (the file, the
	// directory, the parents they make); "" leaves it the guest's (root).
	Owner string           `json:"owner,omitempty"` // write_file, mkdir
	Move  *api.MoveRequest `json:"move,omitempty"`  // move
	Ports []int            `json:"ports,omitempty"` // tunnel
	Port  int              `json:"port,omitempty"`  // dial
}

// VersionReply is the Result of OpVersion.
type VersionReply struct {
	Version  string `json:"version"`  // the guest build's version
	Protocol int    `json:"protocol"` // Version of the guest
}

// ActivityReply is the Result of OpActivity: the processes that live in
// the sandbox besides the guest (PID 1), whoever started them (an exec,
// a background process, one they left behind, double-forked), zombies
// not counted.
type ActivityReply struct {
	Processes int `json:"processes"`
	// Sample describes a few of them, "PID COMM" each.
	Sample []string `json:"sample,omitempty"`
	// PrivateExecs is how many private execs (given secrets or a run
	// token) this guest was asked for since it started, whether or not
	// they still run: the guest's memory may hold what they were given
	// (a memory checkpoint would copy it). A guest before it reports 0.
	PrivateExecs int64 `json:"private_execs,omitempty"`
}

// MaxActivitySample bounds ActivityReply.Sample.
const MaxActivitySample = 4

// Started is the payload of FrameStarted.
type Started struct {
	Pid int  `json:"pid"`
	TTY bool `json:"tty,omitempty"`
}

// Exit is the payload of FrameExit.
type Exit struct {
	ExitCode int    `json:"exit_code"`        // -1 when killed by a signal
	Signal   string `json:"signal,omitempty"` // "KILL", ... when killed by a signal
	TimedOut bool   `json:"timed_out,omitempty"`
}

// WriteRequest writes the length-prefixed JSON header.
func WriteRequest(w io.Writer, req *Request) error {
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encoding request: %w", err)
	}
	if len(b) > MaxHeader {
		return fmt.Errorf("request header of %d bytes exceeds %d: %w", len(b), MaxHeader, errdefs.ErrTooLarge)
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadRequest reads and decodes a header written by WriteRequest. Errors
// wrap errdefs.ErrInvalidArgument for malformed or oversized headers.
func ReadRequest(r io.Reader) (*Request, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxHeader {
		return nil, fmt.Errorf("request header of %d bytes exceeds %d: %w", n, MaxHeader, errdefs.ErrInvalidArgument)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	var req Request
	if err := json.Unmarshal(b, &req); err != nil {
		return nil, fmt.Errorf("decoding request header: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if req.V != Version {
		return nil, fmt.Errorf("protocol version %d not supported (want %d): %w", req.V, Version, errdefs.ErrInvalidArgument)
	}
	return &req, nil
}

// WriteFrame writes one frame. It does not flush.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("frame of %d bytes exceeds %d: %w", len(payload), MaxFrame, errdefs.ErrTooLarge)
	}
	var hdr [5]byte
	hdr[0] = byte(t)
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if len(payload) == 0 {
		return nil
	}
	_, err := w.Write(payload)
	return err
}

// WriteJSONFrame marshals v and writes it as one frame of type t.
func WriteJSONFrame(w io.Writer, t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s frame: %w", t, err)
	}
	return WriteFrame(w, t, b)
}

// ErrFrame is wrapped by ReadFrame's errors for malformed frames (unknown
// type, oversized length). I/O errors are returned as they are; a clean end
// of stream before a frame header is io.EOF, inside a frame
// io.ErrUnexpectedEOF.
var ErrFrame = fmt.Errorf("malformed frame")

// ReadFrame reads one frame. The payload is freshly allocated (the caller
// may keep it). It never allocates more than MaxFrame bytes.
func ReadFrame(r *bufio.Reader) (FrameType, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	t := FrameType(hdr[0])
	if !t.Valid() {
		return 0, nil, fmt.Errorf("%w: unknown type %s", ErrFrame, t)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("%w: %s frame of %d bytes exceeds %d", ErrFrame, t, n, MaxFrame)
	}
	if n == 0 {
		return t, nil, nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return t, b, nil
}
