// Command fakeguest stands in for `agentbox guest selfcheck` in the tests of
// package runner; its behaviour is chosen at link time with
// -ldflags "-X main.mode=...".
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/agentbox/agentbox/internal/guest/proto"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
)

var mode = "ok"

func main() {
	if len(os.Args) != 3 || os.Args[1] != "guest" || os.Args[2] != "selfcheck" {
		os.Exit(2)
	}
	build, _ := runner.Build("/proc/self/exe")
	rep := runner.Report{Version: "1.2.3", Build: build, Protocol: proto.Version, Setup: nsinit.SetupVersion, Static: true, SeccompInstructions: 1}
	switch mode {
	case "fail":
		fmt.Fprintln(os.Stderr, "broken on purpose")
		os.Exit(1)
	case "garbage":
		fmt.Println("hello, not json")
		return
	case "twice":
		_ = json.NewEncoder(os.Stdout).Encode(rep)
	case "wrongbuild":
		rep.Build = "somethingelse"
	case "protocol":
		rep.Protocol = 99
	case "hang":
		time.Sleep(time.Hour)
	case "whoami":
		// Report the uid, the environment size and the interfaces seen.
		ifs, _ := net.Interfaces()
		rep.Version = fmt.Sprintf("uid%d-gid%d-env%d-ifs%d-groups%d", os.Getuid(), os.Getgid(), len(os.Environ()), len(ifs), len(mustGroups()))
	}
	_ = json.NewEncoder(os.Stdout).Encode(rep)
}

func mustGroups() []int {
	g, _ := os.Getgroups()
	return g
}
