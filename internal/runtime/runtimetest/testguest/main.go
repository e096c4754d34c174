// Command testguest is a minimal guest for backend tests: it runs the real
// nsinit setup (or gvinit's, under gVisor), then serves the line protocol of package lineguest on the
// sandbox socket.
//
// Build with CGO_ENABLED=0 (nsinit needs it), as runtimetest.BuildTestGuest does.
package main

import (
	"io"
	"net"
	"os"

	"github.com/agentbox/agentbox/internal/runtime/gvisor/gvinit"
	"github.com/agentbox/agentbox/internal/runtime/native/forker"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest/lineguest"
)

func main() {
	// As the backend's forker when run as one (native.ForkerArgs).
	if len(os.Args) == 3 && os.Args[1] == "guest" && os.Args[2] == "fork" {
		forker.Main()
	}
	// As the holder of an idmap's user namespace (native.HoldArgs).
	if len(os.Args) == 3 && os.Args[1] == "guest" && os.Args[2] == "hold" {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	// As PID 1 of a gVisor sandbox (package gvisor).
	if len(os.Args) == 3 && os.Args[1] == gvinit.Args[0] && os.Args[2] == gvinit.Args[1] {
		gvinit.Main(serve)
	}
	nsinit.Main(serve)
}

func serve(ln net.Listener) error { return lineguest.Serve(ln, lineguest.Options{}) }
