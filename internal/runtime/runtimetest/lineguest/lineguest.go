// Package lineguest is the line protocol of the conformance suite's test
// guest: per connection it reads one line, runs it with /bin/sh -c (stdout
// and stderr combined) and writes the output followed by a final line
// "exit=N". The test guest binary (runtimetest/testguest) serves it as a
// sandbox's PID 1; a backend that serves its guest in-process
// (internal/runtime/inproc) serves it from the test process.
//
// It imports nothing of package testing, so the test guest binary stays
// small.
package lineguest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
)

// Options configure Serve.
type Options struct {
	// Dir is the working directory of every command; "" is "/".
	Dir string
	// Env is added to every command's environment (PATH and HOME are
	// set already).
	Env []string
}

// Serve accepts connections on ln and serves each on its own goroutine
// until Accept fails, and returns that error. Commands still running are
// not waited for.
func Serve(ln net.Listener, opts Options) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go handle(c, opts)
	}
}

func handle(c net.Conn, opts Options) {
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		return
	}
	cmd := exec.Command("/bin/sh", "-c", strings.TrimSuffix(line, "\n"))
	cmd.Env = append([]string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/root"}, opts.Env...)
	cmd.Dir = opts.Dir
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
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
