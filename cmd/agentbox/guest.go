package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/runtime/gvisor/gvinit"
	"github.com/agentbox/agentbox/internal/runtime/native/forker"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
	"github.com/agentbox/agentbox/internal/version"
)

func init() { extraCommands = append(extraCommands, guestCommand) }

// guestSubcommands are added under "guest" (selfcheck.go registers one).
var guestSubcommands []func() *cobra.Command

// guestCommand is the in-sandbox agent. The native backend starts the runner
// copy of this binary as "agentbox guest init" inside fresh namespaces:
// nsinit builds the sandbox's root and security posture, then the guest
// serves the daemon on the inherited socket as PID 1.
func guestCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "guest",
		Short:  "In-sandbox agent (started by the daemon; not for direct use)",
		Hidden: true,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "init",
		Short: "Set up the sandbox and serve as its PID 1",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			if faultInject == "guest-init" {
				os.Exit(1)
			}
			nsinit.Main(func(ln net.Listener) error { return serveGuest(ln, nsinit.ExecCgroupDir()) })
			os.Exit(0)
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   gvinit.Args[1],
		Short: "Serve as PID 1 of a gVisor sandbox (runsc set it up)",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			if faultInject == "guest-init" {
				os.Exit(1)
			}
			gvinit.Main(func(ln net.Listener) error { return serveGuest(ln, nil) })
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "fork",
		Short: "Start guests for the daemon (its guests' forker; see package forker)",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			forker.Main()
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "hold",
		Short: "Wait until stdin closes (holds a user namespace open for the daemon's idmapped mounts)",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			_, _ = io.Copy(io.Discard, os.Stdin)
			os.Exit(0)
		},
	})
	for _, sub := range guestSubcommands {
		cmd.AddCommand(sub())
	}
	return cmd
}

// serveGuest serves the guest protocol on ln, with per-exec cgroups under
// execCgroup (nil: none).
func serveGuest(ln net.Listener, execCgroup *os.File) error {
	// The version names this very build (runner.Build of our own
	// executable) so an upgrade can tell guests apart. It is read when
	// first asked for: parsing our ELF headers is no part of a sandbox's
	// start-up.
	v := sync.OnceValue(func() string {
		build, _ := runner.Build("/proc/self/exe")
		return runner.GuestVersion(version.Version, build)
	})
	// Warnings go to the guest's log file (its stderr, in the sandbox's
	// state dir on the host).
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return guest.Serve(context.Background(), ln, guest.Options{VersionOf: v, Logger: log, ExecCgroup: execCgroup})
}
