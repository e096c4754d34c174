package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/guest/proto"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
	"github.com/agentbox/agentbox/internal/version"
)

// faultInject makes this build fail on purpose, for the tests of guest
// upgrades (test/upgrade_test.go); it is empty in every real build and can
// only be set at link time:
//
//	-ldflags "-X main.faultInject=selfcheck"   `guest selfcheck` exits 1
//	-ldflags "-X main.faultInject=guest-init"  `guest init` exits 1 at once
var faultInject string

func init() {
	guestSubcommands = append(guestSubcommands, selfcheckCommand)
}

// selfcheckCommand is run by the daemon on a candidate runner binary before
// any sandbox is switched to it (internal/runner Validate), as an
// unprivileged uid with no network: it checks what the guest needs to
// start (a static binary, a parsable sandbox config, an assembling seccomp
// policy) and prints a runner.Report as JSON.
func selfcheckCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "selfcheck",
		Short:  "Check this binary can serve as a sandbox guest and print its version as JSON",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := selfcheck()
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
		},
	}
}

func selfcheck() (runner.Report, error) {
	if faultInject == "selfcheck" {
		return runner.Report{}, fmt.Errorf("self-check: fault injected at build time")
	}
	exe := "/proc/self/exe"
	if err := runner.CheckStatic(exe); err != nil {
		return runner.Report{}, fmt.Errorf("self-check: %w", err)
	}
	build, err := runner.Build(exe)
	if err != nil {
		return runner.Report{}, fmt.Errorf("self-check: %w", err)
	}
	sample := `{"hostname":"h","open_files":64}`
	cfg, err := nsinit.ParseConfig([]byte(sample))
	if err != nil || cfg.Hostname != "h" || cfg.OpenFiles != 64 {
		return runner.Report{}, fmt.Errorf("self-check: parsing a sandbox config: %v", err)
	}
	policy := nsinit.Policy()
	insts, err := policy.Assemble()
	if err != nil {
		return runner.Report{}, fmt.Errorf("self-check: assembling the seccomp policy: %w", err)
	}
	if _, err := os.Stat(exe); err != nil {
		return runner.Report{}, fmt.Errorf("self-check: %w", err)
	}
	return runner.Report{
		Version:             version.Version,
		Build:               build,
		Protocol:            proto.Version,
		Setup:               nsinit.SetupVersion,
		Static:              true,
		SeccompInstructions: len(insts),
	}, nil
}
