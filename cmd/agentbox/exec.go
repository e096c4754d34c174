package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// execFlags are the flags of a command run in a sandbox (exec, run).
type execFlags struct {
	interactive bool
	tty         bool
	env         []string
	cwd         string
	user        string
	timeout     time.Duration
	detach      bool
	secrets     []string // NAME[=ENV]
	token       bool
	private     bool
	checkpoint  bool   // checkpoint before the command
	rollback    bool   // and put the files back to it when the command fails
	schema      string // --output-schema FILE
}

func (f *execFlags) request(argv []string) (api.ExecRequest, error) {
	secrets, err := execSecrets(f.secrets)
	if err != nil {
		return api.ExecRequest{}, err
	}
	req, err := f.baseRequest(argv)
	req.Secrets, req.Token = secrets, f.token
	return req, err
}

func (f *execFlags) baseRequest(argv []string) (api.ExecRequest, error) {
	env, err := parseKV("--env", f.env)
	if err != nil {
		return api.ExecRequest{}, err
	}
	if f.timeout < 0 {
		return api.ExecRequest{}, fmt.Errorf("--timeout must not be negative")
	}
	req := api.ExecRequest{Cmd: argv, Env: env, Cwd: f.cwd, User: f.user, TimeoutSeconds: f.timeout.Seconds(), Private: f.private,
		CheckpointBefore: f.checkpoint || f.rollback, RollbackOnFailure: f.rollback}
	if f.schema != "" {
		b, err := os.ReadFile(f.schema)
		if err != nil {
			return api.ExecRequest{}, fmt.Errorf("--output-schema: %w", err)
		}
		if !json.Valid(b) {
			return api.ExecRequest{}, fmt.Errorf("--output-schema: %s is not JSON", f.schema)
		}
		req.OutputSchema = b
	}
	return req, nil
}

func execCmd(g *globals) *cobra.Command {
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] ID|NAME [--] CMD [ARG...]",
		Short: "Run a command in a sandbox and exit with its status",
		Long: "Run a command in a sandbox (its id or name) and exit with its status: 128+N when killed\n" +
			"by signal N (137 for SIGKILL; an out-of-memory kill is also said on stderr), 127 when the\n" +
			"command is not found, 126 when it cannot be executed, 125 for agentbox's own errors.\n" +
			"With -t, a local terminal that reports no size (0x0) counts as 24x80.",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := args[1:]
			if argv[0] == "--" { // kept as an argument: flag parsing stopped at ID
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return errors.New("exec needs a command after the sandbox id")
			}
			req, err := ef.request(argv)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			if ef.detach {
				if ef.tty || ef.interactive {
					return errors.New("--detach cannot be combined with -i or -t")
				}
				p, err := sb.Start(cmd.Context(), req)
				if err != nil {
					return err
				}
				return printResult(cmd, g.json, p.Info(), strconv.Itoa(p.Pid()))
			}
			return runInteractive(cmd.Context(), cmd, sb, req, ef.interactive, ef.tty)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&ef.interactive, "interactive", "i", false, "stream local stdin to the command")
	f.BoolVarP(&ef.tty, "tty", "t", false, "allocate a pseudo-terminal")
	f.StringArrayVarP(&ef.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&ef.cwd, "cwd", "w", "", "working directory inside the sandbox")
	f.StringVarP(&ef.user, "user", "u", "", "user (name or uid[:gid]) inside the sandbox")
	f.DurationVar(&ef.timeout, "timeout", 0, "kill the command and every process it started after this long, e.g. 30s")
	f.BoolVarP(&ef.detach, "detach", "d", false, "run in the background and print the pid")
	f.StringArrayVar(&ef.secrets, "secret", nil, "put stored secret NAME into the command's environment as ENV (default NAME): NAME[=ENV] (repeatable)")
	f.BoolVar(&ef.token, "token", false, "give the command a bridge token in $"+api.RunTokenEnv+", revoked when it ends")
	f.BoolVar(&ef.private, "private", false, "hide the command's environment and memory from the sandbox's other processes (implied by --secret and --token)")
	f.BoolVar(&ef.checkpoint, "checkpoint", false, "checkpoint the sandbox before the command runs")
	f.BoolVar(&ef.rollback, "rollback-on-failure", false, "checkpoint first and put the files back to it if the command fails or times out (through the guest: other processes keep running)")
	f.StringVar(&ef.schema, "output-schema", "", "validate the command's stdout against the JSON Schema in FILE: print it only if it conforms, else fail (exit 125) without printing it")
	f.SetInterspersed(false) // flags after ID belong to CMD
	return cmd
}

func shellCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "shell ID",
		Short: "Open an interactive shell in a sandbox (bash if present, else sh)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			shell := "/bin/sh"
			if fi, err := sb.Stat(cmd.Context(), "/bin/bash"); err == nil && fi.Type != api.FileTypeDir {
				shell = "/bin/bash"
			} else if err != nil && !agentbox.IsNotFound(err) {
				return err
			}
			return runInteractive(cmd.Context(), cmd, sb, api.ExecRequest{Cmd: []string{shell}}, true, true)
		},
	}
}

func attachCmd(g *globals) *cobra.Command {
	var noReplay bool
	cmd := &cobra.Command{
		Use:   "attach ID PID",
		Short: "Follow the output of a process until it exits, and exit with its status",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("invalid pid %q", args[1])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Sandbox(args[0]).Attach(cmd.Context(), pid, !noReplay,
				agentbox.Streams{Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr()})
			return finish(cmd, res, err)
		},
	}
	cmd.Flags().BoolVar(&noReplay, "no-replay", false, "do not print output produced before attaching")
	return cmd
}

func killCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "kill ID PID [SIGNAL]",
		Short: "Send a signal (default TERM) to a process in a sandbox",
		Long: "Send a signal (default TERM) to the process group of a process started by exec.\n" +
			"KILL also kills every process that exec started, wherever it went (new sessions,\n" +
			"double forks, other process groups): the exec's cgroup.",
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("invalid pid %q", args[1])
			}
			sig := "TERM"
			if len(args) == 3 {
				sig = strings.TrimPrefix(strings.ToUpper(args[2]), "SIG")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.Sandbox(args[0]).Process(pid).Signal(cmd.Context(), sig)
		},
	}
}

func psCmd(_ *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ps ID|NAME",
		Short: "List the processes started in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: listing[api.Process]{
			fetch: func(ctx context.Context, c *agentbox.Client, args []string) ([]api.Process, error) {
				return c.Sandbox(args[0]).Processes(ctx)
			},
			header: "PID\tTTY\tSTATUS\tSTARTED\tCMD",
			row: func(p api.Process) string {
				status := "running"
				switch {
				case p.Running:
				case p.TimedOut:
					status = "timed out"
				case p.Signal != "":
					status = fmt.Sprintf("killed (SIG%s)", p.Signal)
				case p.ExitCode != nil:
					status = fmt.Sprintf("exited (%d)", *p.ExitCode)
				default:
					status = "exited"
				}
				tty := "-"
				if p.TTY {
					tty = "yes"
				}
				return fmt.Sprintf("%d\t%s\t%s\t%s ago\t%s", p.Pid, tty, status, humanDuration(time.Since(p.StartedAt)), strings.Join(p.Cmd, " "))
			},
		}.run,
	}
}

// runInteractive runs req in sb with the command's streams wired to the
// CLI's: output streamed, stdin streamed when interactive, a pseudo-terminal
// (local terminal in raw mode, window size changes forwarded) with tty, and
// otherwise SIGINT/SIGTERM/SIGHUP forwarded to the process (the third one
// gives up waiting). It returns exitStatus for a non-zero exit.
func runInteractive(ctx context.Context, cmd *cobra.Command, sb *agentbox.Sandbox, req api.ExecRequest, interactive, tty bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, out := cmd.InOrStdin(), cmd.OutOrStdout()
	inFd, inTerm := terminalFd(in)
	outFd, outTerm := terminalFd(out)

	if tty {
		size := api.TTY{Rows: defaultRows, Cols: defaultCols}
		if outTerm {
			size = terminalSize(outFd)
		}
		req.TTY = &size
		if interactive && inTerm {
			old, err := term.MakeRaw(inFd)
			if err != nil {
				return fmt.Errorf("putting the terminal in raw mode: %w", err)
			}
			defer term.Restore(inFd, old)
		}
	}
	req.StdinOpen = interactive

	sigs := make(chan os.Signal, 4)
	if tty && outTerm {
		signal.Notify(sigs, syscall.SIGWINCH)
	} else if !tty {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	}
	defer signal.Stop(sigs)

	started := func(p *agentbox.Process) {
		if interactive {
			go func() {
				// The upload ends at local EOF or when the command exits (ctx).
				_ = p.WriteStdin(ctx, in, true)
			}()
		}
		go forwardSignals(ctx, cancel, p, sigs, outFd)
	}
	res, err := sb.Exec(ctx, req, agentbox.Streams{Stdout: out, Stderr: cmd.ErrOrStderr(), Started: started})
	if tty && interactive && inTerm {
		// Raw mode turned "\n" into a bare line feed; end on a fresh line.
		fmt.Fprint(out, "\r")
	}
	return finish(cmd, res, err)
}

func forwardSignals(ctx context.Context, cancel context.CancelFunc, p *agentbox.Process, sigs <-chan os.Signal, outFd int) {
	interrupts := 0
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-sigs:
			if s == syscall.SIGWINCH {
				size := terminalSize(outFd)
				_ = p.Resize(ctx, size.Rows, size.Cols)
				continue
			}
			if interrupts++; interrupts >= 3 {
				cancel() // the process ignores us; stop waiting
				return
			}
			_ = p.Signal(ctx, strings.TrimPrefix(unix.SignalName(s.(syscall.Signal)), "SIG"))
		}
	}
}

// finish turns the end of a command into the CLI's result: nil for status
// 0, exitStatus otherwise (128+N when killed by signal N).
func finish(cmd *cobra.Command, res *agentbox.Result, err error) error {
	if err != nil {
		return err
	}
	if res.TimedOut {
		fmt.Fprintln(cmd.ErrOrStderr(), "agentbox: command timed out and was killed")
	}
	if res.OOMKilled {
		fmt.Fprintln(cmd.ErrOrStderr(), "agentbox: command killed: the sandbox ran out of memory (its memory limit, `agentbox create --memory`)")
	}
	if res.RolledBack {
		fmt.Fprintf(cmd.ErrOrStderr(), "agentbox: command failed; sandbox rolled back to checkpoint %s\n", res.Checkpoint)
	}
	code := res.ExitCode
	if code < 0 {
		code = 128 + int(unix.SignalNum("SIG"+res.Signal))
		if res.Signal == "" || code == 128 {
			code = 137
		}
	}
	if code == 0 {
		return nil
	}
	return exitStatus(code)
}

// The terminal size used when the local one is unknown or reports 0x0
// (script(1), some CI runners): what a VT100 has.
const defaultRows, defaultCols = 24, 80

// terminalSize returns the size of terminal fd, each dimension it does not
// know (0, or an error) replaced by the default 24x80.
func terminalSize(fd int) api.TTY {
	size := api.TTY{Rows: defaultRows, Cols: defaultCols}
	if w, h, err := term.GetSize(fd); err == nil {
		if h > 0 && h <= 0xffff {
			size.Rows = uint16(h)
		}
		if w > 0 && w <= 0xffff {
			size.Cols = uint16(w)
		}
	}
	return size
}

// terminalFd reports the descriptor of s and whether it is a terminal.
func terminalFd(s any) (int, bool) {
	f, ok := s.(interface{ Fd() uintptr })
	if !ok {
		return -1, false
	}
	fd := int(f.Fd())
	return fd, term.IsTerminal(fd)
}
