// Package gvinit is the guest's first stage under the gVisor backend
// (package gvisor): what package native/nsinit is under the native one, but
// with almost nothing left to do. runsc has already built everything nsinit
// builds by hand: the root filesystem, /proc, /dev, the runner at
// /.agentbox, the hostname, the capability sets, no_new_privs and the
// rlimits come from the OCI bundle the backend wrote, and the sentry (a
// user-space kernel) stands between the sandbox and the host's.
//
// What differs is how the listening socket reaches the guest. The sentry
// cannot accept on a listening host socket handed in as a descriptor (an
// imported host socket is a connected endpoint only), so the guest creates
// it: it binds SocketPath, inside a directory the backend bind-mounts from
// the host for this one sandbox (under the sentry's own /dev, so the mount
// point is never part of the root filesystem) with runsc's
// --host-uds=create, so that
// runsc's gofer creates a real host socket there and the sentry accepts
// the host's connections on it. The backend moves that socket to the
// sandbox's socket path once it answers, before any user code runs, and
// then closes the directory to the sandbox (see gvisor.Create).
//
// The guest makes itself non-dumpable, as nsinit does, so that sandbox
// processes cannot reach it through /proc/1.
//
// Protocol with the host: the guest is started as "agentbox guest
// init-gvisor" (Args) as PID 1 of the sandbox; it reports a failure as a
// JSON nsinit-style {"error": ...} line on stderr (the guest log) and
// exits 1; success is the socket answering.
package gvinit

import (
	"encoding/json"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// Args are the runner's arguments (after argv[0]) that start this stage.
var Args = []string{"guest", "init-gvisor"}

// SocketDir is where the backend mounts the socket's host directory, and
// SocketPath the socket the guest binds in it.
const (
	SocketDir  = "/dev/.agentbox-run"
	SocketName = "guest.sock"
	SocketPath = SocketDir + "/" + SocketName
)

// Failure is what the guest writes on stderr when it cannot start.
type Failure struct {
	Error string `json:"error"`
}

// Main binds SocketPath and runs serve on it. It never returns: it exits
// 1 when listening or serve fails, 0 when serve returns nil.
func Main(serve func(ln net.Listener) error) {
	// As under native (nsinit): no sandbox process may read the guest's
	// memory, environment or root through /proc/1, or ptrace it; the
	// sentry applies the same dumpable rule as Linux.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fail(fmt.Errorf("prctl PR_SET_DUMPABLE: %w", err))
	}
	// The control socket first: the host takes both over once the guest
	// socket answers, so both must be there by then.
	ctl, err := listen(SocketDir + "/" + CtlName)
	if err != nil {
		fail(fmt.Errorf("listening on %s: %w", CtlName, err))
	}
	ln, err := listen(SocketPath)
	if err != nil {
		fail(fmt.Errorf("listening on %s: %w", SocketPath, err))
	}
	r := newRelistener(ln)
	go control(r, ctl)
	if err := serve(r); err != nil {
		fail(err)
	}
	os.Exit(0)
}

func fail(err error) {
	b, _ := json.Marshal(Failure{Error: err.Error()})
	fmt.Fprintf(os.Stderr, "%s\n", b)
	os.Exit(1)
}
