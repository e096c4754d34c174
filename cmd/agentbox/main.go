// Command agentbox is the one binary of agentbox: the daemon (serve), the
// in-sandbox agent (guest) and the client verbs (create, exec, run, cp, ...).
// The client verbs talk to the daemon only through the Go SDK (sdk/go).
//
// Exit status: a command run with exec/run/attach exits with that command's
// status (128+N when killed by signal N); agentbox's own failures exit 125.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/version"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// startEmbedded is set by embedded.go; it starts an in-process daemon and returns its address (for AGENTBOX_HOST form) and a stop function.
var startEmbedded func(ctx context.Context) (host string, stop func(), err error)

// extraCommands are added to the root command; files that wire the daemon
// (serve.go, guest.go) register into it from init().
var extraCommands []func() *cobra.Command

// defaultHost is the daemon address when neither --host nor AGENTBOX_HOST
// is set (a variable so tests can point it elsewhere).
var defaultHost = agentbox.DefaultHost

// exitAgentbox is the status for agentbox's own errors (as docker uses it).
const exitAgentbox = 125

// The statuses of a command that could not be run, as shells and docker
// use them: not found, and found but not executable.
const (
	exitNotFound      = 127
	exitNotExecutable = 126
)

func main() {
	os.Exit(execute(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// execute runs the command line args and returns the process exit status.
func execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := rootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var st exitStatus
	if errors.As(err, &st) {
		return int(st)
	}
	printError(stderr, err)
	var ae *agentbox.APIError
	if errors.As(err, &ae) {
		switch ae.Reason {
		case agentbox.ReasonCommandNotFound:
			return exitNotFound
		case agentbox.ReasonCommandNotExecutable:
			return exitNotExecutable
		}
	}
	return exitAgentbox
}

// exitStatus is returned by verbs that end with a command's exit status; it
// is not an agentbox failure and is not printed.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// printError prints err as "agentbox: <message> (request id X)".
func printError(w io.Writer, err error) {
	msg := err.Error()
	if id := agentbox.RequestID(err); id != "" {
		msg += " (request id " + id + ")"
	}
	if agentbox.IsUnreachable(err) {
		msg += "\n(is the daemon running? start it with `agentbox serve`, or set --host / " + agentbox.EnvHost + ")"
	}
	fmt.Fprintf(w, "agentbox: %s\n", msg)
}

// globals are the persistent flags of the root command.
type globals struct {
	host   string
	apiKey string
	caCert string
	json   bool
}

// client returns an SDK client for the configured daemon.
func (g *globals) client() (*agentbox.Client, error) {
	key := g.apiKey
	if key == "" {
		key = os.Getenv(agentbox.EnvAPIKey)
	}
	opts := []agentbox.Option{agentbox.WithHost(g.host), agentbox.WithAPIKey(key)}
	if ca := cmp.Or(g.caCert, os.Getenv(agentbox.EnvCACert)); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("reading the CA certificates: %w", err)
		}
		opts = append(opts, agentbox.WithCACert(pem))
	}
	return agentbox.New(opts...)
}

// rootCmd builds the whole command tree.
func rootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "agentbox",
		Short: "Disposable, isolated Linux sandboxes for AI agents",
		Long: "Disposable, isolated Linux sandboxes for AI agents.\n\n" +
			"Wherever a command takes a sandbox ID, the sandbox's name (create --name) works too.\n" +
			"Exit status: 0 on success; exec, run and attach exit with the command's status (128+N when\n" +
			"killed by signal N: 137 for SIGKILL, also when the sandbox ran out of memory, which is said\n" +
			"on stderr), 127 when the command is not found, 126 when it cannot be executed; 125 for\n" +
			"agentbox's own errors.",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	defHost := os.Getenv(agentbox.EnvHost)
	if defHost == "" {
		defHost = defaultHost
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.host, "host", defHost, "daemon address: unix:///path.sock or http(s)://host:port (env "+agentbox.EnvHost+")")
	pf.StringVar(&g.apiKey, "api-key", "", "API key for a TCP daemon (default from env "+agentbox.EnvAPIKey+")")
	pf.StringVar(&g.caCert, "ca-cert", "", "PEM file of CA certificates an https daemon's certificate is verified against, instead of the system roots (default from env "+agentbox.EnvCACert+")")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of text")

	root.AddCommand(
		versionCmd(g),
		createCmd(g), lsCmd(g), inspectCmd(g), rmCmd(g), runCmd(g),
		execCmd(g), shellCmd(g), psCmd(g), attachCmd(g), killCmd(g),
		cpCmd(g), templateCmd(g),
	)
	for _, f := range extraCommands {
		root.AddCommand(f())
	}
	addCompletions(root)
	return root
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's and, if reachable, the daemon's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := struct {
				Client    string    `json:"client"`
				API       string    `json:"api"`
				Daemon    *api.Info `json:"daemon,omitempty"`
				DaemonErr string    `json:"daemon_error,omitempty"`
			}{Client: version.Version, API: api.Version}
			c, err := g.client()
			if err != nil {
				return err
			}
			if info, err := c.Info(cmd.Context()); err != nil {
				out.DaemonErr = err.Error()
			} else {
				out.Daemon = &info
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "Client: agentbox %s (API %s)\n", out.Client, out.API)
			if out.Daemon != nil {
				fmt.Fprintf(w, "Daemon: agentbox %s (API %s, backend %s) at %s\n", out.Daemon.Version, out.Daemon.API, out.Daemon.Backend, c.Host())
			} else {
				fmt.Fprintf(w, "Daemon: not reachable at %s\n", c.Host())
			}
			return nil
		},
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
