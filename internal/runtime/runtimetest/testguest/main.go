// Command testguest is a minimal guest for backend tests: it runs the real
// nsinit setup, then serves a line protocol on the sandbox socket. Per
// connection it reads one line, runs it with /bin/sh -c (stdout and stderr
// combined) and writes the output followed by a final line "exit=N".
//
// Build with CGO_ENABLED=0 (nsinit needs it), as runtimetest.BuildTestGuest does.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/agentbox/agentbox/internal/runtime/native/forker"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
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
	nsinit.Main(serve)
}

func serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go handle(c)
	}
}

func handle(c net.Conn) {
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		return
	}
	cmd := exec.Command("/bin/sh", "-c", strings.TrimSuffix(line, "\n"))
	cmd.Env = []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/root"}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal()) // as a shell reports it
		}
	case err != nil:
		out = append(out, []byte(err.Error())...)
		code = 127
	}
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	_, _ = c.Write(out)
	fmt.Fprintf(c, "exit=%d\n", code)
}
